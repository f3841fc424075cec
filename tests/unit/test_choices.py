"""The ledger of model choices (perfmodel/choices.py) is where every `fitted` label comes from: each
choice the model can undo, reverted, moves exactly the rows the ledger names; every field of
Calibration and of a hardware profile is set by a choice, sourced, or moves no paper row (so a switch
left off the ledger fails); and a claim read from such a row shows both readings (artifacts/claims/claims.py).

Pricing the paper's tables again is the cost here: the committed records are read once per module,
each table's rows priced again once per change, and the model's collective schedules and their prices
are cached across changes (perfmodel/schedule.py, network.py), so a change that moves no memory is
priced in about a second."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from zerobench.artifacts.claims import claims
from zerobench.artifacts.claims.claim_readers import cell
from zerobench.artifacts.judging import choice_readings
from zerobench.artifacts.tables import registry
from zerobench.artifacts.tables.build import record_paths
from zerobench.fitting import external
from zerobench.perfmodel import choices
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.hardware import get_profile
from zerobench.perfmodel.hardware_profile import HardwareProfile
from zerobench.perfmodel.implementation import PROFILES
from zerobench.record_files import read_record
from zerobench.sweeps import sheets
from zerobench.trial.fields import IMPLEMENTATIONS

RESULTS = Path(__file__).resolve().parents[2] / "results"
RUNS = RESULTS / "runs"
PAPER = ("fig2", "fig3", "fig5", "fig6", "fig7", "fig8", "table2")


def _pairs(name: str) -> list[tuple[dict, dict]]:
    """The committed records of a paper artifact joined to its sheet's trials, as the table is built."""
    trials = sheets.trials_by_id(sheets.load_sheet(name))
    files = [p for p in record_paths(sorted(map(str, RUNS.glob(f"{name}.g*")))) if p.stem in trials]
    return [(trials[p.stem], read_record(p)) for p in files]


@pytest.fixture(scope="module")
def paper_pairs():
    return {name: _pairs(name) for name in PAPER}


def _moved(changes: dict, paper_pairs) -> set[tuple[str, str]]:
    """The paper tables' rows whose prediction `changes` move (choice_readings.moved), over every table."""
    got = set()
    for name, pairs in paper_pairs.items():
        builder = registry.entry(name).table
        got |= {(name, key) for key in choice_readings.moved(builder, pairs, changes)}
    return got


# The memory a card offers: reverting one of these searches every row's largest batch again (10-30 s a
# choice here), so CI runs those (the ci marker); the walk below, that every field is on the ledger,
# sourced or moving no row, runs everywhere.
CAPACITY = {"fragmentation", "cache_headroom", "nccl_communicator_bytes", "memory_bytes", "cuda_context_bytes"}
REVERSIBLE = [
    pytest.param(c, marks=pytest.mark.ci) if CAPACITY & {key for key, _ in c.without} else c
    for c in choices.CHOICES
    if c.without
]


@pytest.mark.parametrize("choice", REVERSIBLE, ids=lambda c: c.name)
def test_a_reverted_choice_moves_exactly_the_rows_the_ledger_names(choice, paper_pairs):
    """Each undoable choice reverted (`without`): the rows of the paper's tables whose prediction moves,
    computed, are the ones the ledger names (`rows`, `carriers` and `moves`), no more and no fewer."""
    named = {row for row in choices.named_rows(choice) if row[0] in PAPER}
    assert _moved(dict(choice.without), paper_pairs) == named


# Every field of the two types the model is priced from, and the paper's hardware they are read on
FIELDS = [f.name for f in dataclasses.fields(Calibration)] + [f.name for f in dataclasses.fields(HardwareProfile)]
V100 = get_profile("v100-32gb-dgx2")


def _moved_by_each(fields: list[str]) -> dict:
    """Each field moved off its value (a switch flipped, a number x1.5): a change that moves a paper
    row wherever the field reaches the model at all."""
    out = {}
    for f in fields:
        value = getattr(DEFAULT, f) if hasattr(DEFAULT, f) else getattr(V100, f)
        if isinstance(value, bool):
            out[f] = not value
        elif isinstance(value, int | float) and value:
            out[f] = value * 1.5
        else:  # a table, a name, an empty value: it has no nearby value to move to
            raise AssertionError(f"field {f}={value!r}: set it by a choice of the ledger or say its source (SOURCED)")
    return out


def test_every_field_is_on_the_ledger_sourced_or_moves_no_paper_row(paper_pairs):
    """The ledger is complete by construction: the fields no choice sets and no source gives, moved all
    at once, move no row of the paper's tables; a switch added and left off the ledger would."""
    assert choices.on_ledger() | set(choices.SOURCED) <= set(FIELDS), "a ledger or SOURCED field that does not exist"
    left = choices.unaccounted(FIELDS)
    assert {"zero_os_stage1", "memory_bytes", "cuda_context_bytes"} <= choices.on_ledger()
    assert not _moved(_moved_by_each(left), paper_pairs), f"fields off the ledger move paper rows: {left}"


def test_a_switch_left_off_the_ledger_fails_the_walk(paper_pairs, monkeypatch):
    """The walk bites: with `overlap_grad_reduce off` struck from the ledger, its field is unaccounted
    and, moved with the others, moves the rows it was chosen on."""
    monkeypatch.setattr(choices, "CHOICES", tuple(c for c in choices.CHOICES if "overlap_grad_reduce" not in c.fields))
    left = choices.unaccounted(FIELDS)
    assert "overlap_grad_reduce" in left
    assert _moved(_moved_by_each(left), paper_pairs) >= set(choices._OVERLAP)


def test_a_choice_naming_no_row_must_say_why():
    with pytest.raises(ValueError, match="why"):
        choices.Choice("x", "switch", "a switch", (), "abc1234")
    with pytest.raises(ValueError, match="kind"):
        choices.Choice("x", "guess", "a guess", (("fig2", "ZeRO 8B"),), "abc1234")


def test_every_choice_names_a_commit_of_this_repository():
    root = Path(__file__).resolve().parents[2]
    for c in choices.CHOICES:
        found = subprocess.run(["git", "cat-file", "-e", f"{c.commit}^{{commit}}"], cwd=root, capture_output=True)
        assert found.returncode == 0, (c.name, c.commit)


def test_a_claim_read_from_a_fitted_row_takes_the_worse_of_both_readings():
    table = pd.DataFrame(dict(key=["DDP 1.38B"], ours=[19.0], paper=[20.0], role=["fitted"], source="modelled",
                              fitted_by=["ddp_overlap"], ours_without_choice=[12.0]))  # fmt: skip
    claim = claims.Claim("c", "text", "Fig 8", "TFLOPS", cell("fig8", "DDP 1.38B"), None, 10)
    row = claims.ledger({"fig8": table}, (claim,)).iloc[0]
    assert row.verdict == claims.REFUTED  # with: -5 % (reproduced); without: -40 % (refuted)
    assert row.ours == 19.0 and row.ours_without_choice == 12.0 and "with it 19" in row.note
    # a fitted row the model cannot read without its choice stays not testable
    untestable = claims.ledger({"fig8": table.assign(ours_without_choice=None)}, (claim,)).iloc[0]
    assert untestable.verdict == claims.UNTESTABLE and "19 (reproduced" in untestable.note
    # and one that misses gives its miss: the worst reading shown, fitted or not
    missed = claims.ledger({"fig8": table.assign(ours=12.0, ours_without_choice=None)}, (claim,)).iloc[0]
    assert missed.verdict == claims.REFUTED and "12 (refuted" in missed.note


def test_committed_claims_show_both_readings_of_the_rows_a_switch_was_chosen_on():
    ledger = pd.read_csv(RESULTS / "claims.csv").set_index("claim")
    for name in ("fig8_ddp_under_20tf", "table2_pos_mp16"):
        assert pd.notna(ledger.loc[name, "ours_without_choice"]), name
        assert "without it" in ledger.loc[name, "note"]


def test_the_holdout_rows_a_choice_was_made_on_are_validation():
    hold = pd.read_csv(external.HOLDOUT_OUT)
    roles = hold.groupby("source").role.unique().to_dict()
    assert list(roles["megatron-lm-2021"]) == ["validation"] and list(roles["megatron-lm-2019"]) == ["holdout"]
    expressed = hold[external.expressible(hold) & (hold.source == "megatron-lm-2021")]
    assert len(expressed) == 6 and (expressed.implementation == "deepspeed-0.3").all()
    assert expressed.first_error_pct.abs().mean() == pytest.approx(69.1, abs=0.05)  # the first scoring
    assert "validation" in expressed.history.iloc[0]
    assert set(pd.read_csv(RESULTS / "external_loso.csv").role) == {"validation"}


def test_the_engine_names_the_models_implementation_profiles():
    assert IMPLEMENTATIONS == tuple(sorted(PROFILES))


@pytest.mark.parametrize("artifact", PAPER)
def test_every_judged_row_of_a_paper_table_has_a_numeric_band(artifact):
    """Judged and fitted rows with an error carry a band (a fitted row's serves its claim's reading);
    a judged row says whether it is inside."""
    df = pd.read_csv(RESULTS / f"{artifact}.csv")
    banded = df[df.role.isin(("judged", "fitted")) & df.error_pct.notna()]
    assert len(banded) and banded.band_pct.notna().all()
    judged = banded[banded.role == "judged"]
    assert judged.inside_band.notna().all()
    assert (judged.inside_band == (judged.error_pct.abs() <= judged.band_pct)).all()


def test_the_h200_rows_gather_host_s_moves_are_the_ones_it_names(tmp_path, monkeypatch):
    """Remade without the fitted term, the H200 rows whose TFLOPS move are the one it was fitted on
    and the ones the ledger says carry it, no more and no fewer."""
    import shutil

    from zerobench.checks import gpu_check
    from zerobench.perfmodel import host_cost

    shutil.copytree(RESULTS / "gpu/h200", tmp_path / "h200")
    with_term = pd.DataFrame(gpu_check.compare(tmp_path / "h200"))
    monkeypatch.setattr(host_cost, "GATHER_HOST_S", 0.0)
    without = pd.DataFrame(gpu_check.compare(tmp_path / "h200"))
    moved = with_term.predicted_tflops.sub(without.predicted_tflops).abs() > 1e-9
    keys = {
        ("gpu/h200", f"{r.model} stage {r.stage} micro-batch {r.micro_batch}") for r in with_term[moved].itertuples()
    }
    named = {row for row, names in choices.fitted_rows("gpu/h200").items() if "host_cost.GATHER_HOST_S" in names}
    assert keys == named


def test_model_takes_the_implementation_field_and_the_record_names_it():
    from zerobench.sources import modelled

    base = dict(model="gpt-100b", gpus=1536, stage=3, micro_batch=1, checkpoint_activations=True,
                hardware="a100-80gb", precision="fp16")  # fmt: skip
    listed, flat = modelled.record({**base, "implementation": "deepspeed-0.3"}), modelled.record(base)
    assert (listed["implementation"], flat["implementation"]) == ("deepspeed-0.3", "efficient")
    assert listed["tflops_per_gpu"] < flat["tflops_per_gpu"]  # list-form host work waited on
