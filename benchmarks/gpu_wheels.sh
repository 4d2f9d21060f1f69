#!/usr/bin/env bash
# The wheels a GPU machine without a package registry needs for benchmarks/gpu_vs_trl.py's TRL
# side (its image holds torch, transformers, accelerate, pandas and pyarrow; not trl, datasets,
# dill or multiprocess), downloaded here into .whl/ for Python 3.12 on x86-64 (pure Python, so
# the platform tags only let pip choose). benchmarks/gpu_all.sh installs them from there into
# /tmp/site when .whl/ exists. transformers and accelerate are carried too, so that TRL runs with
# the versions its CPU figures in docs/performance.md were measured with.
#
#   bash benchmarks/gpu_wheels.sh          # then carry .whl with the device call
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl trl==1.16.0 transformers==5.24.0 datasets==5.2.0 accelerate==1.16.0 dill==0.4.1 \
    multiprocess==0.70.19
du -sh .whl
ls .whl
