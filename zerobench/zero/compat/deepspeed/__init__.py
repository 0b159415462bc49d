"""DeepSpeed's interface on zerobench's engine: a ``ds_config`` read into typed configs (``config``, ``precision``,
``values``, ``zero_section``), ``initialize`` (``deepspeed.initialize``'s counterpart), the engine names DeepSpeed
users call (``engine``), learning-rate schedules (``lr_schedules``), a client optimizer (``client``), tagged
checkpoint directories (``checkpoints``; what a load takes from where, ``module_load``), ``zero_to_fp32`` and the
per-parameter ``safe_get_full_*`` functions (``tensor_fragment``)."""
