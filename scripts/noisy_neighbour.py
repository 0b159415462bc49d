"""A reproducible noisy neighbour for checking timing methods: ``python scripts/noisy_neighbour.py [SEED]``.

Alternates bursts (0.2-3 s) of single-thread matmul plus 32 MiB streaming (caches, memory bandwidth)
with idle gaps (0.2-3 s), until killed. Run it with ``OPENBLAS_NUM_THREADS=1`` next to
``zerobench regress --ab`` to see how a schedule (one after the other, ``--concurrent``, ``--lockstep``)
holds up in the noisy periods a shared VM has; the README's A/B table was measured this way.
"""

import random
import sys
import time

import numpy as np


def main(seed: int) -> None:
    rng = random.Random(seed)
    a = np.random.default_rng(seed).random((512, 512), dtype=np.float32)
    big = np.ones(8 * 2**20, dtype=np.float32)
    while True:
        end = time.monotonic() + rng.uniform(0.2, 3.0)
        while time.monotonic() < end:
            a = (a @ a) / 512.0
            big *= 1.0000001
        time.sleep(rng.uniform(0.2, 3.0))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
