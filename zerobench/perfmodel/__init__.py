"""The calibrated performance model (`source: modelled`): hardware profiles, compute efficiency,
α–β collectives and memory feasibility. Pure Python/numpy/pandas — it never imports torch."""

from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.perfmodel.hardware import PROFILES, HardwareProfile, get_profile
from zerobench.perfmodel.predict import Prediction, estimate_text, layout, model_record, predict

__all__ = [
    "DEFAULT", "Calibration", "PROFILES", "HardwareProfile", "get_profile",
    "Prediction", "estimate_text", "layout", "model_record", "predict",
]  # fmt: skip
