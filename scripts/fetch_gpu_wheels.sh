#!/usr/bin/env bash
# Builds .whl/: the Python packages a lent GPU machine lacks for `scripts/gpu_check.sh deepspeed-offload` and
# `scripts/gpu_first.sh` (DeepSpeed and what it needs beyond that machine's image; megatron-core for the
# megatron-core peer), made here where PyPI is reachable.
# The GPU machine runs Python 3.12 and has no network; carry `.whl` and install there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
# DeepSpeed is published as a source archive only: it is built here into a pure-Python wheel with its
# C++/CUDA ops left to DeepSpeed's just-in-time build (DS_BUILD_OPS=0), as `pip install deepspeed` does.
set -euo pipefail
cd "$(dirname "$0")/.."
DS=${DS_VERSION:-0.19.8}
rm -rf .whl && mkdir .whl
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$DS" -w .whl
# Not in the GPU image (see the device README's package list): pydantic and its closure, hjson, and megatron-core
# (the version zerobench's Megatron code is written against: baselines/megatron.py MEGATRON_VERSION; it needs
# torch, numpy and packaging, which the image has).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
  typing-extensions==4.15.0 megatron-core==0.16.1
ls -1 .whl
du -sh .whl
