"""Row provenance (``zerobench/results/provenance.py``): a process that runs no tensor (a sweep's parent writing
its status rows) records the same torch version and hardware as a training rank, without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
{pre}
from zerobench.results.provenance import provenance
p = provenance()
print(json.dumps({{"torch_imported": "torch" in sys.modules, "torch": p["torch_version"], "hw": p["hardware"]}}))
"""


def _probe(pre: str) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_provenance_without_torch_matches_a_training_rank():
    import torch

    if any(getattr(torch.version, k, None) for k in ("cuda", "hip", "xpu")):
        pytest.skip("a build for an accelerator asks torch for the hardware: only a CPU-only build is read without it")
    bare, rank = _probe(""), _probe("import torch")
    assert not bare["torch_imported"] and rank["torch_imported"]
    assert bare["torch"] == rank["torch"] == torch.__version__
    assert bare["hw"] == rank["hw"] and bare["hw"]["kind"] == "cpu"
