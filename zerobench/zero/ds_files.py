"""DeepSpeed's file methods on a ``ZeroEngine``, called on every rank as DeepSpeed's: ``save_checkpoint`` and
``load_checkpoint`` (a tagged directory, ``zero/checkpoint_dir.py``) and ``save_16bit_model`` (the whole model as
one plain state dict, ``zero/export.py``)."""

from __future__ import annotations

from zerobench.zero.checkpoint_dir import load_tagged, save_tagged
from zerobench.zero.export import save_16bit_model


class DeepSpeedFiles:
    """Mixed into ``ZeroEngine``."""

    def save_checkpoint(self, save_dir, tag: str | None = None, client_state: dict | None = None, **options):
        """``save_dir/<tag>`` and ``save_dir/latest``, as DeepSpeed's, with its ``save_latest`` and
        ``exclude_frozen_parameters``."""
        return save_tagged(self, save_dir, tag, client_state, **options)

    def load_checkpoint(self, load_dir, tag: str | None = None, **options):
        """(the checkpoint's path, its client state); (None, None) when there is no ``latest``. DeepSpeed's options:
        ``load_module_strict``, ``load_optimizer_states``, ``load_module_only``, ...."""
        return load_tagged(self, load_dir, tag, **options)

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """The model's state dict, trained parameters in the training dtype, written by DP rank 0 to
        ``save_dir/save_filename`` for ``model.load_state_dict`` without ZeRO (at stage 3 too: always gathered)."""
        return save_16bit_model(self, save_dir, save_filename, exclude_frozen_parameters)
