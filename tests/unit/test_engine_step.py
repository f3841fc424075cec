"""The engine's step (zerobench/engine/step.py): grad_accum micro-batches of the rank's own slice,
then one optimizer step; one process, the tiny model."""

import pytest
import torch

from tests.engine_cases import rel_err, spec_for
from zerobench.engine.parallel import topology
from zerobench.engine.parallel.comms import Comms
from zerobench.engine.step import train_step
from zerobench.runtime.batches import SyntheticTokens, sequences
from zerobench.runtime.train import build_engine


def _engine(micro_batch: int, grad_accum: int):
    spec = spec_for("tiny", micro_batch=micro_batch, grad_accum=grad_accum, steps=1)
    return build_engine(spec, topology.single_process(), Comms(), torch.device("cpu")), spec


def test_accumulated_micro_batches_step_as_one_batch_of_them_all():
    """Four sequences as 2 micro-batches of 2 or as 1 of 4: the same mean loss, the same update."""
    tokens = sequences(SyntheticTokens(256, 32, 0), 0, 0, (4,))
    two, _ = _engine(2, 2)
    one, _ = _engine(4, 1)
    loss_two = train_step(two, tokens.view(2, 2, -1))
    loss_one = train_step(one, tokens.view(1, 4, -1))
    assert loss_two == pytest.approx(loss_one, rel=1e-6)
    assert rel_err(two.full_parameters(), one.full_parameters()) < 1e-5  # the parity tests' tolerance


def test_a_slice_of_another_shape_is_refused_naming_the_fields():
    engine, _ = _engine(2, 2)
    wrong = sequences(SyntheticTokens(256, 32, 0), 0, 0, (1, 4))
    with pytest.raises(ValueError, match="grad_accum=2 micro-batches of micro_batch=2"):
        train_step(engine, wrong)
