"""Process environment (torchrun / Slurm), process groups, and ledger-recording collectives."""
