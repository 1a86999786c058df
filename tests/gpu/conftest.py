"""GPU tests: an NVIDIA GPU (and for some, the CUDA build of vLLM and nvcc). `make test-gpu` runs
them on a GPU host; elsewhere each is skipped with the reason that names what is missing (the
markers `gpu`, `needs_cuda_vllm`: see tests/conftest.py)."""
