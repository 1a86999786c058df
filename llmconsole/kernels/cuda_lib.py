"""The CUDA kernel's shared library (from cuda_build.compile_cuda(kind="shared")) called with
ctypes on torch CUDA tensors. ctypes rather than a torch extension: the library then builds
with nvcc alone, against whatever CUDA torch the GPU host has, with no ABI to match.

The call, on vLLM's CUDA KV layout (what a vLLM CUDA attention backend does for its decode rows):

    lib = CudaKernelLibrary(compile_cuda(kind="shared", archs=("sm_90",)).path)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)  # as FlashAttention
    lib.paged_attention_decode(query, key_cache, value_cache, block_table, seq_lens, scale,
                               out=out, max_seq_len=max_seq_len, num_splits=0, workspace=None,
                               k_scale=None, v_scale=None)

- query: [num_seqs, num_heads, head_size] bf16 or fp16, one decode token per sequence (the
  backend's decode rows), last axis contiguous, strides multiples of 8 elements, 16-byte aligned.
- key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size] views of the layer's
  cache (kv_layout.split_cuda_kv_cache), any strides on the first three axes (every
  KVCacheLayout vLLM resolves), the last contiguous; the query's dtype, or fp8 e4m3
  (torch.float8_e4m3fn, or uint8 holding e4m3 as vLLM allocates it). head_size 64, 128 or 256;
  block_size a multiple of 16; any num_heads / num_kv_heads ratio.
- block_table: int32 [num_seqs, >= blocks used]; seq_lens: int32 [num_seqs], vLLM's seq_lens
  (the context including the token being decoded); both on the query's device.
- scale: the softmax scale. k_scale, v_scale: fp8 caches only, each a float or a one-element
  float32 tensor on the device (vLLM's layer._k_scale / _v_scale), read by the kernel at launch.
- out: optional, same shape and dtype as query (a view with other row strides is fine), last axis
  contiguous; allocated when None. Only its [num_seqs, num_heads, head_size] elements are written.
- num_splits: split-K partitions of each context; 0 chooses them from batch, heads, max_seq_len,
  the SM count and the kernel's occupancy (plan()). Any count is correct for any lengths, so a
  CUDA graph may be captured with a fixed count and replayed on other batches. Under capture pass
  num_splits (or max_seq_len) and a workspace, so nothing syncs or allocates.
- workspace: a uint8 CUDA tensor of at least workspace_bytes(num_seqs, num_heads, head_size,
  num_splits) bytes (0 for one split); allocated per call when missing or too small.
Launches on torch.cuda.current_stream() and returns out. Raises ValueError/TypeError (naming the
argument) before launching, CudaKernelError when the launch fails.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from llmconsole.kernels.checks import check_cuda_decode_args

DTYPE_CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3, torch.uint8: 3}
_GEOMETRY_FIELDS = 10


class CudaKernelError(RuntimeError):
    """A launch failed; the message carries the CUDA runtime's own words."""


@dataclass(frozen=True)
class DecodePlan:
    num_splits: int
    workspace_bytes: int
    sm_count: int
    ctas_per_sm: int


class CudaKernelLibrary:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        lib = ctypes.CDLL(self.path)
        i, ll, vp = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        lib.llmc_paged_attention_decode.restype = i
        lib.llmc_paged_attention_decode.argtypes = (
            [vp] * 6 + [i] * 6 + [ll] * 10 + [ctypes.c_float, i, i, vp, vp, i, vp, ctypes.c_size_t, vp]
        )
        lib.llmc_paged_attention_workspace_bytes.restype = ctypes.c_size_t
        lib.llmc_paged_attention_workspace_bytes.argtypes = [i] * 4
        lib.llmc_paged_attention_supports.restype = i
        lib.llmc_paged_attention_supports.argtypes = [i] * 3
        lib.llmc_paged_attention_geometry.restype = i
        lib.llmc_paged_attention_geometry.argtypes = [i, i, i, ctypes.POINTER(i)]
        lib.llmc_paged_attention_choose_splits.restype = i
        lib.llmc_paged_attention_choose_splits.argtypes = [i] * 6
        lib.llmc_paged_attention_ctas_per_sm.restype = i
        lib.llmc_paged_attention_ctas_per_sm.argtypes = [i] * 5
        lib.llmc_paged_attention_build_options.restype = ctypes.c_char_p
        lib.llmc_cuda_error_string.restype = ctypes.c_char_p
        lib.llmc_cuda_error_string.argtypes = [i]
        self._lib = lib
        self._sm_count: dict[int, int] = {}
        self._ctas: dict[tuple[int, ...], int] = {}

    def build_options(self) -> str:
        options: bytes = self._lib.llmc_paged_attention_build_options()  # restype c_char_p
        return options.decode()

    def error_string(self, code: int) -> str:
        message: bytes = self._lib.llmc_cuda_error_string(code)  # restype c_char_p
        return message.decode()

    def supports(self, head_size: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> bool:
        """Whether this build has a kernel for the head size and (query, cache) dtypes."""
        if dtype not in DTYPE_CODES or (kv_dtype or dtype) not in DTYPE_CODES:
            return False
        return bool(
            self._lib.llmc_paged_attention_supports(head_size, DTYPE_CODES[dtype], DTYPE_CODES[kv_dtype or dtype])
        )

    def geometry(self, head_size: int, group: int, fp8_kv: bool = False) -> list[int]:
        """The kernel's compile-time geometry (see llmc_paged_attention_geometry in the .cu)."""
        values = (ctypes.c_int * _GEOMETRY_FIELDS)()
        if self._lib.llmc_paged_attention_geometry(head_size, group, 3 if fp8_kv else 1, values) != 0:
            raise ValueError(f"no kernel geometry for head_size {head_size}")
        return list(values)

    def workspace_bytes(self, num_seqs: int, num_heads: int, head_size: int, num_splits: int) -> int:
        return int(self._lib.llmc_paged_attention_workspace_bytes(num_seqs, num_heads, head_size, num_splits))

    def choose_splits(
        self, num_seqs: int, num_heads: int, num_kv_heads: int, max_seq_len: int, sm_count: int, ctas_per_sm: int
    ) -> int:
        """The split count for a batch on a GPU with sm_count SMs running ctas_per_sm decode CTAs
        each (pure arithmetic; no GPU needed)."""
        return int(
            self._lib.llmc_paged_attention_choose_splits(
                num_seqs, num_heads, num_kv_heads, max_seq_len, sm_count, ctas_per_sm
            )
        )

    def ctas_per_sm(
        self,
        head_size: int,
        num_heads: int,
        num_kv_heads: int,
        dtype: torch.dtype,
        kv_dtype: torch.dtype,
        device: torch.device,
    ) -> int:
        """Decode CTAs resident per SM on `device`, from the CUDA occupancy API (cached)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, head_size, num_heads, num_kv_heads, DTYPE_CODES[dtype], DTYPE_CODES[kv_dtype])
        if key not in self._ctas:
            with torch.cuda.device(index):
                got = int(self._lib.llmc_paged_attention_ctas_per_sm(*key[1:]))
            if got < 0:
                raise CudaKernelError(f"occupancy query failed: {self.error_string(-got)} (code {-got})")
            self._ctas[key] = got
        return self._ctas[key]

    def plan(
        self,
        num_seqs: int,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        max_seq_len: int,
        dtype: torch.dtype,
        kv_dtype: torch.dtype,
        device: torch.device,
    ) -> DecodePlan:
        """The split count and workspace a launch would use (what to preallocate before capture)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._sm_count:
            self._sm_count[index] = torch.cuda.get_device_properties(index).multi_processor_count
        sm_count = self._sm_count[index]
        ctas = self.ctas_per_sm(head_size, num_heads, num_kv_heads, dtype, kv_dtype, device)
        splits = self.choose_splits(num_seqs, num_heads, num_kv_heads, max_seq_len, sm_count, ctas)
        return DecodePlan(splits, self.workspace_bytes(num_seqs, num_heads, head_size, splits), sm_count, ctas)

    def paged_attention_decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        max_seq_len: int | None = None,
        out: torch.Tensor | None = None,
        num_splits: int = 0,
        workspace: torch.Tensor | None = None,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decode attention on vLLM's CUDA KV layout; see the module docstring for the contract."""
        check_cuda_decode_args(query, key_cache, value_cache, block_tables, seq_lens, out)
        if out is None:
            out = torch.empty_like(query, memory_format=torch.contiguous_format)
        num_seqs, num_heads, head_size = query.shape
        _, block_size, num_kv_heads, _ = key_cache.shape
        if not self.supports(head_size, query.dtype, key_cache.dtype):
            raise ValueError(
                f"no kernel in {self.path} for head_size {head_size}, {query.dtype} query, {key_cache.dtype} cache"
            )
        if num_seqs == 0:
            return out
        if num_splits <= 0:
            if max_seq_len is None:
                max_seq_len = int(seq_lens.max())
            num_splits = self.plan(
                num_seqs, num_heads, num_kv_heads, head_size, max_seq_len, query.dtype, key_cache.dtype, query.device
            ).num_splits
        need = self.workspace_bytes(num_seqs, num_heads, head_size, num_splits)
        workspace_ptr: int | None = None
        if need:
            if workspace is None or workspace.numel() * workspace.element_size() < need:
                workspace = torch.empty(need, dtype=torch.uint8, device=query.device)
            workspace_ptr = workspace.data_ptr()
        fp8 = DTYPE_CODES[key_cache.dtype] == 3
        scales = [_device_scale(s, query.device) if fp8 else None for s in (k_scale, v_scale)]
        stream = torch.cuda.current_stream(query.device).cuda_stream
        code = self._lib.llmc_paged_attention_decode(
            out.data_ptr(),
            query.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            block_tables.data_ptr(),
            seq_lens.data_ptr(),
            num_seqs,
            num_heads,
            num_kv_heads,
            head_size,
            block_size,
            block_tables.stride(0),
            query.stride(0),
            query.stride(1),
            out.stride(0),
            out.stride(1),
            *key_cache.stride()[:3],
            *value_cache.stride()[:3],
            float(scale),
            DTYPE_CODES[query.dtype],
            DTYPE_CODES[key_cache.dtype],
            scales[0].data_ptr() if scales[0] is not None else None,
            scales[1].data_ptr() if scales[1] is not None else None,
            num_splits,
            workspace_ptr,
            need,
            stream,
        )
        if code != 0:
            raise CudaKernelError(f"paged_attention_decode launch failed: {self.error_string(code)} (code {code})")
        return out


def _device_scale(scale: float | torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.numel() < 1 or scale.dtype != torch.float32 or scale.device != device:
            raise ValueError(
                f"an fp8 scale tensor must be float32 on {device}, got "
                f"{scale.dtype} {tuple(scale.shape)} on {scale.device}"
            )
        return scale
    return torch.full((1,), float(scale), dtype=torch.float32, device=device)
