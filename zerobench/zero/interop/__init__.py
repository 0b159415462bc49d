"""How the engine meets torch's own tools: ``model.zero_grad()`` (``module_zero_grad``), tensors inside inputs and
outputs (``containers``), mixed-precision input casts (``forward_inputs``), the profiler and ``torch.compile``
(``tooling``) and ``engine.destroy()`` (``teardown``)."""
