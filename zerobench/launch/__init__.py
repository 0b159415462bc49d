"""Launchers beyond the local one: ``srun`` inside an allocation, ``sbatch`` submission from a login node."""
