#!/usr/bin/env bash
# benchmarks/gpu.py on a GPU machine without network access, in one command. Prepare the kit first, on a
# machine with network access (docs/gpu.md, "On a GPU machine without network access"):
#     python -m benchmarks.device_kit
# then copy the checkout with its .device/ folder to the GPU machine and run there:
#     bash benchmarks/device_run.sh
# Arguments go to benchmarks/gpu.py (default: every section, the targets first, the peers last).
# Output: the tables on stdout and in $OUT/gpu.txt; the GPU tests in $OUT/tests.txt; versions and nvidia-smi
# in $OUT/machine.txt ($OUT: /tmp/ottvid-device unless set).
# Each section prints when done, so a run stopped by a time limit still keeps what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/ottvid-device}
mkdir -p "$out"
[ -d .device/whl ] || { echo "no .device/whl: run python -m benchmarks.device_kit on a machine with network access" \
    "and copy .device/ with the checkout" >&2; exit 2; }
# the machine's own torch, triton, numpy, tokenizers...; transformers, av, qwen-vl-utils from the kit
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ottvid-site \
    .device/whl/*.whl || exit 1
export PYTHONPATH=/tmp/ottvid-site:$PWD OTTVID_MIRROR=$PWD/.device/mirror HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c 'import sys, torch, triton, transformers, av, numpy; print(sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, "transformers", transformers.__version__, "av", av.__version__, "numpy", numpy.__version__)'
} 2>&1 | tee "$out/machine.txt"
# Decoding on the machine's many cores (one container with FFmpeg's frame threads against several,
# each with a share of the threads), off unless asked: OTTVID_DEVICE_DECODE=1 runs it before the GPU
# sections, =only runs nothing else. ~3 minutes: 1-minute clips made with PyAV, no torchcodec or decord there.
if [ "${OTTVID_DEVICE_DECODE:-0}" != 0 ]; then
    timeout 420 python3 -m benchmarks.decode --minutes 1 --kinds 1080p-bframes 1080p-no-bframes 4k \
        --clips /tmp/ottvid-clips --workers 1 2 4 8 16 --timeout 120 2>&1 | tee "$out/decode.txt"
    [ "$OTTVID_DEVICE_DECODE" = only ] && exit 0
fi
# The tests that need the GPU first (the compiled kernels' decisions against the PyTorch path, the
# launch and sync counts, the varlen attention, the vision tower's kernels): tests/test_fused.py,
# tests/test_attention.py and tests/test_fast_vision.py on CUDA; OTTVID_DEVICE_TESTS=0 skips them,
# OTTVID_DEVICE_TESTS=fast runs the last only.
case "${OTTVID_DEVICE_TESTS:-1}" in
    0) ;;
    fast) timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_fast_vision.py 2>&1 | tee "$out/tests.txt" ;;
    *) timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_fused.py tests/test_attention.py \
           tests/test_fast_vision.py tests/test_saliency.py \
           tests/test_graphed_prefill.py::test_the_cuda_graph_replays_the_eager_padded_forward_bit_for_bit \
           2>&1 | tee "$out/tests.txt" ;;
esac
# Where one request's time goes, kernel by kernel (benchmarks/gpu_trace.py); OTTVID_DEVICE_TRACE=0 skips it.
if [ "${OTTVID_DEVICE_TRACE:-1}" != 0 ]; then
    timeout 240 python3 -m benchmarks.gpu_trace 2>&1 | grep -v '^USDT' | tee "$out/trace.txt"
fi
if [ $# -eq 0 ]; then
    set -- --sections launches stages model prefill ttft methods
fi
python3 -m benchmarks.gpu "$@" 2>&1 | tee "$out/gpu.txt"
