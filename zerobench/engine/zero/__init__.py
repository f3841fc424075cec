"""ZeRO-DP (paper §5): `apply_zero` wraps a plain model in the engine of its stage, one file each
(stage0.py – stage3.py) over a shared core (core.py).
`apply_zero` is in apply.py, so that the layout (partition.py) imports without torch."""
