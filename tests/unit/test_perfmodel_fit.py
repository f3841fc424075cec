"""The fitted constants in DEFAULT are what the fit procedure gives on FIT_SET: a model change
that moves the optimum shows here until `python -m zerobench.perfmodel.fit` is re-run."""

from __future__ import annotations

import pytest

from zerobench.perfmodel.calibration import DEFAULT, FIT_SET, FITTED
from zerobench.perfmodel.fit import THROUGHPUT_KNOBS, throughput_objective


def test_fit_set_names_every_fitted_group():
    assert ", ".join(THROUGHPUT_KNOBS) in FITTED
    assert len(FIT_SET) == len({p for points in FITTED.values() for p in points}) == 12


@pytest.mark.parametrize("knob", THROUGHPUT_KNOBS)
def test_default_is_a_local_optimum_of_the_throughput_fit(knob):
    # Nelder–Mead's fixed point: moving any knob 2% either way makes the fit points worse
    base = throughput_objective(DEFAULT)
    assert base < 5.0  # mean |error| in % over the eight throughput fit points
    for factor in (0.98, 1.02):
        moved = DEFAULT.replace(**{knob: getattr(DEFAULT, knob) * factor})
        assert throughput_objective(moved) > base, (knob, factor)
