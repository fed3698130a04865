#!/usr/bin/env bash
# The CUDA checks in one run, on a machine with a GPU and PyTorch: the CUDA tests
# (tests/test_cuda.py, tests/test_cuda_ragged.py, tests/test_packed_rows.py), then the Tree-LSTM training benchmark
# (bench_cuda.py). Wheels in .whl/ (greenlet, conllu, rdkit for that machine's Python) are
# installed first into a private folder, for a machine that cannot reach a package index.
#
#     bash benchmarks/cuda_check.sh [OUT]     # logs, cuda.json and cuda.md go to OUT
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="src:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
python3 -m pytest -p no:cacheprovider -o addopts="-q" tests/test_cuda.py tests/test_cuda_ragged.py tests/test_packed_rows.py \
    2>&1 | tee "$out/cuda-tests.log"
tests=$?
python3 benchmarks/bench_cuda.py --out "$out" 2>&1 | tee "$out/cuda-bench.log"
exit $((tests || $?))
