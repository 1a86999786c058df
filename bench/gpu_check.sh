#!/bin/sh
# Build, check and time the CUDA decode kernel on this machine's GPU: bench/gpu_check.sh [--quick]
cd "$(dirname "$0")/.." && exec "${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}" bench/gpu_check.py "$@"
