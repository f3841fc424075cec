"""The modelled source (`source: modelled`, `zerobench model`, a sheet's modelled groups): one
trial's record from the calibrated performance model (zerobench/perfmodel/), under its batch/depth
policy. No torch import."""

from __future__ import annotations

from collections.abc import Mapping

from zerobench.perfmodel import model_record
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.implementation import DEFAULT_IMPLEMENTATION
from zerobench.trial import TrialSpec, configs, policy
from zerobench.trial.fields import defaults


def record(values: Mapping, cal: Calibration = DEFAULT) -> dict:
    """The modelled record of a trial's field values (parsed `zerobench model` flags, or a sheet's
    trial), under its batch/depth policy; `zero_os` models P_os as ZeRO-OS (zero_os_stage1)."""
    v = {**defaults("model"), "command": "model", **values}
    if v["zero_os"]:
        cal = cal.replace(zero_os_stage1=True)
    attention = v["attention"] or "materialized"
    implementation = v.get("implementation") or DEFAULT_IMPLEMENTATION

    def predict(spec: TrialSpec) -> dict:
        return model_record(
            spec.model,
            spec.parallel,
            spec.precision,
            spec.train,
            v["hardware"],
            v["gpus_per_node"],
            cal,
            attention=attention,
            implementation=implementation,
        )

    spec, field = TrialSpec(*configs(v)), policy.searched(v)
    return predict(spec) if field is None else policy.search(spec, field, predict)
