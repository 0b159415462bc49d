"""Tensor (model) parallelism, Megatron-style, applied to a plain model by ``apply_tp``."""
