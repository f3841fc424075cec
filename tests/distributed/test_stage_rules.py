"""The engine against the stage table (zerobench/stages.py): at every stage, the data-parallel
collectives one step issues are the ones the table lists, each moving Ψ(N_d − 1)/N_d elements per
rank (paper §7), and the model states it keeps are partitioned as the table says (paper §5)."""

from collections import Counter

import pytest

from tests.engine_cases import engine_run, spec_for
from tests.worlds import threaded
from zerobench.memory import BYTES_PER_PARAM
from zerobench.stages import RING_UNITS, STATES, rule


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_issues_and_keeps_what_its_rule_says(stage):
    dp, steps = 2, 2
    r = threaded(dp, engine_run, spec_for("tiny", dp=dp, stage=stage, steps=steps))[0]
    unit = r["padded"] * (dp - 1) / dp
    moved = {k.split("/")[0]: v / steps / unit for k, v in r["volume"].items() if k.endswith("/dp") and v / steps > 8}
    expected = Counter()
    for op in rule(stage).collectives:
        expected[op] += RING_UNITS[op]
    assert moved == pytest.approx(dict(expected), rel=1e-3)
    assert rule(stage).volume == {0: 2, 1: 2, 2: 2, 3: 3}[stage]  # the paper's 2Ψ, 2Ψ, 2Ψ, 3Ψ (§7)
    held = r["state_bytes"]
    for state, per_param in zip(STATES, BYTES_PER_PARAM["fp32"]):
        assert held[state] == per_param * r["padded"] // rule(stage).divisor(state, dp), state


def test_a_stage_outside_the_table_is_refused():
    with pytest.raises(ValueError, match="^stage=4"):
        rule(4)
    with pytest.raises(ValueError, match="^state='activations'"):
        rule(0).divisor("activations", 2)
