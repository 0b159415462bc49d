"""Session-wide test setup: Triton kernels run under the interpreter when there is no CUDA device.

``TRITON_INTERPRET`` must be set before triton is first imported, hence here (the root conftest is
imported before any test module).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
