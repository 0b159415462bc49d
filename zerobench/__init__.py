"""zerobench: a ZeRO implementation (stages 0-3) and the harness that reproduces the ZeRO paper."""

__version__ = "0.1.0"
