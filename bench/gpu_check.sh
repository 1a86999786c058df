#!/bin/sh
# On a GPU host: build the CUDA decode kernel for this GPU, check it against the float64 reference on
# vLLM's CUDA KV layout, measure the GPU's read bandwidth and time the kernel, vLLM's Triton decode
# and SDPA as CUDA-graph replays (under 5 minutes). bench/gpu_check.sh [--quick] [--no-variants]
# Exit 0 all checks passed, 1 a check failed, 2 this machine cannot run it; JSON to $OUT if set.
cd "$(dirname "$0")/.." && exec "${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}" bench/gpu_check.py "$@"
