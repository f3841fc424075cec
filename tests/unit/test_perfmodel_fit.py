"""The fitted constants in DEFAULT are what the fit procedure gives on FIT_SET: a model change
that moves the optimum shows here until `python -m zerobench.fitting.fit` is re-run."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.fitting.fit import _BOUNDS, THROUGHPUT_KNOBS, throughput_objective
from zerobench.perfmodel.constants import DEFAULT, FITTED, Calibration


def test_every_fitted_constant_is_a_calibration_field_with_paper_points():
    fields = {f.name for f in dataclasses.fields(Calibration)}
    for group, points in FITTED.items():  # a renamed field or an emptied group shows here
        assert set(group.split(", ")) <= fields, group
        assert points, group
    assert ", ".join(THROUGHPUT_KNOBS) in FITTED  # the knobs `fit` moves are the group it fits


@pytest.mark.parametrize("knob", THROUGHPUT_KNOBS)
def test_default_is_a_local_optimum_of_the_throughput_fit(knob):
    # Nelder–Mead's fixed point: moving any knob 2% either way inside its physical bounds makes the
    # fit points worse (a knob at a bound, e.g. an efficiency of 1, is moved inwards only)
    base = throughput_objective(DEFAULT)
    assert base < 6.0  # mean |error| in % over the eight throughput fit points
    lo, hi = _BOUNDS[knob]
    moves = [f for f in (0.98, 1.02) if lo <= getattr(DEFAULT, knob) * f <= hi]
    assert moves
    for factor in moves:
        moved = DEFAULT.replace(**{knob: getattr(DEFAULT, knob) * factor})
        assert throughput_objective(moved) > base, (knob, factor)
