"""The process-group backends a run may ask for, apart from ``env.py`` (which imports torch), so that a config
validates its request without importing torch (``zerobench plan`` answers in well under a second)."""

BACKENDS = ("auto", "nccl", "gloo")
"""``auto`` (gloo on CPU; NCCL on CUDA unless ranks share a GPU: ``env.choose_backend``), ``nccl`` or ``gloo``."""
