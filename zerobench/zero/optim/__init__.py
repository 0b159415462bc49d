"""The optimizer step over this rank's flat fp32 partitions: AdamW (``adamw``), the window-end step with its
overflow check and clipping (``step``), the ``torch.optim.Optimizer`` interface (``torch_optimizer``), param groups
(``param_groups``), loss scaling (``loss_scale``) and where Adam's moments live and in what form (``states``,
``quant8``)."""
