"""Baseline systems the paper compares against (Megatron-LM), run on zerobench's model sizes and data."""
