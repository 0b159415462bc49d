"""The engine's state outside training: shards of it and back (``shards``), sharded checkpoint directories
(``checkpoint``) written as transactions (``transaction``), ``model.load_state_dict`` after ``apply_zero``
(``module_state``), the full parameters in a context (``gathered``) and one plain state dict (``export``)."""
