"""Reading one checkpoint file: ``torch.load`` with ``weights_only=True``, and a damaged file refused in one line.

A file truncated by a job killed while saving, overwritten, or not written by ``torch.save`` made ``torch.load``
raise from deep inside its zip reader (``PytorchStreamReader failed reading zip archive: failed finding central
directory``) without naming the file. ``load_file`` names it and gives the reader's first line, for the shards
(``zero/state_dict.py``) and for the files beside them (``zero/checkpoint_dir.py``: client state, buffers and frozen
parameters, the LR scheduler).
"""

from __future__ import annotations

import os
import pickle

import torch


class CheckpointMismatch(ValueError):
    """A checkpoint of another model (names, shapes) or a damaged file."""


def load_file(path: str | os.PathLike):
    """``torch.load(path)`` on the CPU, ``weights_only=True``; a damaged file is a one-line ``CheckpointMismatch``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:  # truncated, overwritten, or not torch.save's
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointMismatch(f"checkpoint file {path} is damaged: {first}") from None
