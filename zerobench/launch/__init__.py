"""Launchers: ``local.py`` starts N processes on this host, ``slurm.py`` runs under ``srun`` inside an
allocation or submits with ``sbatch``; ``worker.py`` is the entry point of one launched rank."""
