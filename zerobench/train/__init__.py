"""Training: synthetic data, the training loop, and the local multi-process launcher."""
