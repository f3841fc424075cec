"""zerobench: a reference ZeRO engine and a reproduction of the ZeRO paper (SC20)."""

__version__ = "0.1.0"
