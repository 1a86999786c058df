"""The CUDA kernel's shared library (from cuda_build.compile_cuda(kind="shared")) called with
ctypes on torch CUDA tensors. ctypes rather than a torch extension: the library then builds
with nvcc alone, against whatever CUDA torch the GPU host has, with no ABI to match."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from llmconsole.kernels.checks import check_decode_args

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


class CudaKernelError(RuntimeError):
    """A launch failed; the message carries the CUDA runtime's own words."""


class CudaKernelLibrary:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        lib = ctypes.CDLL(self.path)
        lib.llmc_paged_attention_decode.restype = ctypes.c_int
        lib.llmc_paged_attention_decode.argtypes = (
            [ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_longlong] * 4
            + [ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
               ctypes.c_void_p])
        lib.llmc_paged_attention_workspace_bytes.restype = ctypes.c_size_t
        lib.llmc_paged_attention_workspace_bytes.argtypes = [ctypes.c_int] * 5
        lib.llmc_paged_attention_build_options.restype = ctypes.c_char_p
        lib.llmc_cuda_error_string.restype = ctypes.c_char_p
        lib.llmc_cuda_error_string.argtypes = [ctypes.c_int]
        self._lib = lib

    def build_options(self) -> str:
        options: bytes = self._lib.llmc_paged_attention_build_options()  # restype c_char_p
        return options.decode()

    def workspace_bytes(self, num_seqs: int, num_heads: int, head_size: int,
                        max_context_len: int, partition_size: int = 0) -> int:
        return int(self._lib.llmc_paged_attention_workspace_bytes(
            num_seqs, num_heads, head_size, max_context_len, partition_size))

    def error_string(self, code: int) -> str:
        message: bytes = self._lib.llmc_cuda_error_string(code)  # restype c_char_p
        return message.decode()

    def paged_attention_decode(self, query: torch.Tensor, kv_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               scale: float, *, max_context_len: int | None = None,
                               out: torch.Tensor | None = None, partition_size: int = 0,
                               workspace: torch.Tensor | None = None) -> torch.Tensor:
        """Same contract as kernels.cpu.paged_attention_decode, on CUDA tensors, launched on
        torch's current stream. Pass max_context_len to avoid a device-to-host copy."""
        check_decode_args(query, kv_cache, block_tables, context_lens, out, device_type="cuda")
        block_tables = block_tables.contiguous()
        context_lens = context_lens.contiguous()
        if out is None:
            out = torch.empty_like(query, memory_format=torch.contiguous_format)
        num_seqs, num_heads, head_size = query.shape
        if max_context_len is None:
            max_context_len = int(context_lens.max()) if num_seqs else 0
        need = self.workspace_bytes(num_seqs, num_heads, head_size, max_context_len,
                                    partition_size)
        workspace_ptr: int | None = None
        if need:
            if workspace is None or workspace.numel() * workspace.element_size() < need:
                workspace = torch.empty(need, dtype=torch.uint8, device=query.device)
            workspace_ptr = workspace.data_ptr()
        stream = torch.cuda.current_stream(query.device).cuda_stream
        code = self._lib.llmc_paged_attention_decode(
            out.data_ptr(), query.data_ptr(), kv_cache.data_ptr(), block_tables.data_ptr(),
            context_lens.data_ptr(), num_seqs, num_heads, kv_cache.shape[1], head_size,
            kv_cache.shape[2], block_tables.shape[1], max_context_len,
            query.stride(0), query.stride(1), out.stride(0), out.stride(1), float(scale),
            _DTYPE_CODES[query.dtype], int(partition_size),
            workspace_ptr, need, stream)
        if code != 0:
            raise CudaKernelError(f"paged_attention_decode launch failed: "
                                  f"{self.error_string(code)} (code {code})")
        return out
