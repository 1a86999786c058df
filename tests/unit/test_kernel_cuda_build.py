"""The CUDA kernel compiles for sm_80 and sm_90, its ptxas resource report parses and responds to
the build knobs, and the occupancy those figures allow is computed and reported. No GPU is
needed; without nvcc the compile tests skip."""

from __future__ import annotations

import json
import re

import pytest
import torch

from llmconsole.kernels.cuda_build import (
    CudaBuildOptions,
    compile_cuda,
    find_nvcc,
    parse_ptxas_report,
)
from llmconsole.kernels.cuda_lib import CudaKernelLibrary
from llmconsole.kernels.info import format_kernel_info, kernel_info
from llmconsole.kernels.occupancy import SM_LIMITS, dynamic_smem, kernel_occupancy, occupancy

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) not found; set CUDA_HOME or PATH")

TYPE_PAIRS = [
    ("__nv_bfloat16", "__nv_bfloat16"),
    ("__half", "__half"),
    ("__nv_bfloat16", "__nv_fp8_e4m3"),
    ("__half", "__nv_fp8_e4m3"),
]


def expected_kernels(head_sizes=(64, 128, 256), fp8=True) -> set[str]:
    pairs = TYPE_PAIRS if fp8 else TYPE_PAIRS[:2]
    return {
        *(f"llmc::decode_kernel<{q}, {kv}, {d}, {nt}>" for q, kv in pairs for d in head_sizes for nt in (1, 2)),
        "llmc::merge_kernel<__nv_bfloat16>",
        "llmc::merge_kernel<__half>",
    }


EXPECTED_KERNELS = expected_kernels()
# The knob variants build only the head-128 16-bit kernels: the same code, a quarter of the build.
VARIANT = {"only_head_size": 128, "fp8_kv": False}

PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN4llmc17llmc_merge_kernelIfEEvNS_6ParamsE' for 'sm_80'
ptxas info    : Function properties for _ZN4llmc17llmc_merge_kernelIfEEvNS_6ParamsE
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8 bytes cumulative stack size, 512 bytes smem, 488 bytes cmem[0]
ptxas info    : Compile time = 25.216 ms
ptxas info    : Compiling entry function '_ZN4llmc17llmc_merge_kernelIfEEvNS_6ParamsE' for 'sm_90'
ptxas info    : Function properties for _ZN4llmc17llmc_merge_kernelIfEEvNS_6ParamsE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 34 registers, used 1 barriers, 16 bytes smem
"""


def test_parses_ptxas_report_text():
    report = parse_ptxas_report(PTXAS_SAMPLE)
    assert set(report) == {"sm_80", "sm_90"}
    ((name80, r80),) = report["sm_80"].items()
    assert "merge_kernel" in name80
    assert (r80.registers, r80.spill_store_bytes, r80.spill_load_bytes) == (40, 4, 12)
    assert (r80.stack_bytes, r80.shared_bytes, r80.constant_bytes) == (8, 512, 488)
    (r90,) = report["sm_90"].values()
    assert (r90.registers, r90.shared_bytes, r90.constant_bytes) == (34, 16, 0)


def test_options_render_flags():
    flags = CudaBuildOptions(
        max_registers=64, fast_math=True, warp_reduce=False, smem_carveout_kb=96, only_head_size=128, fp8_kv=False
    ).nvcc_flags()
    assert "-maxrregcount=64" in flags and "--use_fast_math" in flags
    assert "-DLLMC_WARP_REDUCE=0" in flags and "-DLLMC_SMEM_CARVEOUT_KB=96" in flags
    assert "-DLLMC_ONLY_HEAD_SIZE=128" in flags and "-DLLMC_FP8_KV=0" in flags
    # ptxas lets __launch_bounds__ override -maxrregcount, so a cap drops them.
    assert "-DLLMC_LAUNCH_BOUNDS=0" in flags
    assert "-DLLMC_LAUNCH_BOUNDS=1" in CudaBuildOptions().nvcc_flags()
    with pytest.raises(ValueError, match="multiple of 32"):
        CudaBuildOptions(threads=100)
    with pytest.raises(ValueError, match="only_head_size"):
        CudaBuildOptions(only_head_size=96)


@pytest.fixture(scope="module")
def default_build():
    return compile_cuda(CudaBuildOptions(), archs=("sm_80", "sm_90"))


@needs_nvcc
def test_compiles_for_sm80_and_sm90_with_a_report(default_build):
    assert set(default_build.resources) == {"sm_80", "sm_90"}
    for arch, kernels in default_build.resources.items():
        assert set(kernels) == EXPECTED_KERNELS, arch
        for name, r in kernels.items():
            assert r.registers > 0, (arch, name)
            assert r.shared_bytes > 0, (arch, name)  # the reduction slots
            assert r.spill_store_bytes == 0, (arch, name, "spills with default options")


@needs_nvcc
@pytest.mark.parametrize("cap", [64, 32])
def test_register_cap_is_honoured(default_build, cap):
    capped = compile_cuda(CudaBuildOptions(max_registers=cap, **VARIANT), archs=("sm_80", "sm_90"))
    for arch in ("sm_80", "sm_90"):
        assert set(capped.resources[arch]) == expected_kernels((128,), fp8=False)
        for name, r in capped.resources[arch].items():
            assert 0 < r.registers <= cap, (arch, name, r.registers)
    # The default build uses more than the cap somewhere, so the report must move.
    assert any(r.registers > cap for r in default_build.resources["sm_80"].values())
    assert any(capped.resources["sm_80"][n] != default_build.resources["sm_80"][n] for n in capped.resources["sm_80"])


@needs_nvcc
def test_shared_memory_tree_changes_static_smem(default_build):
    tree = compile_cuda(CudaBuildOptions(warp_reduce=False, **VARIANT), archs=("sm_80",))
    for name, r in tree.resources["sm_80"].items():
        warp = default_build.resources["sm_80"][name]
        if "merge_kernel" in name:
            assert r.shared_bytes > warp.shared_bytes, name  # one slot per thread, not per warp
        else:
            assert r.shared_bytes == warp.shared_bytes, name  # the decode kernel's are in fragments


@needs_nvcc
def test_fast_math_and_carveout_compile():
    result = compile_cuda(CudaBuildOptions(fast_math=True, smem_carveout_kb=96, **VARIANT), archs=("sm_90",))
    assert "--use_fast_math" in result.flags
    assert all(r.registers > 0 for r in result.resources["sm_90"].values())


@needs_nvcc
def test_shared_library_exports_launcher():
    # Host-side entry points work without a GPU; a launch reports the CUDA error, not a crash.
    lib = CudaKernelLibrary(compile_cuda(CudaBuildOptions(only_head_size=128), archs=("sm_90",), kind="shared").path)
    assert "LLMC_WARP_REDUCE=1" in lib.build_options() and "LLMC_ONLY_HEAD_SIZE=128" in lib.build_options()
    assert lib.supports(128, torch.bfloat16) and lib.supports(128, torch.float16)
    assert lib.supports(128, torch.bfloat16, torch.float8_e4m3fn) and lib.supports(128, torch.float16, torch.uint8)
    assert not lib.supports(64, torch.bfloat16) and not lib.supports(128, torch.float32)
    assert lib.workspace_bytes(4, 32, 128, 1) == 0  # one split: no workspace
    assert lib.workspace_bytes(4, 32, 128, 3) == 4 * (4 * 32 * 3 * 128 + 4 * 32 * 3)
    raw = lib._lib.llmc_paged_attention_decode

    def call(
        num_heads=8,
        num_kv_heads=2,
        head_size=128,
        block_size=16,
        k_strides=(4096, 256, 128),
        dtype=1,
        kv_dtype=1,
        num_splits=1,
        workspace_bytes=0,
    ):
        return raw(
            None,
            None,
            None,
            None,
            None,
            None,
            1,
            num_heads,
            num_kv_heads,
            head_size,
            block_size,
            4,
            1024,
            128,
            1024,
            128,
            *k_strides,
            4096,
            256,
            128,
            0.1,
            dtype,
            kv_dtype,
            None,
            None,
            num_splits,
            None,
            workspace_bytes,
            None,
        )

    for bad in (
        dict(num_kv_heads=3),
        dict(head_size=64),
        dict(head_size=96),
        dict(block_size=8),
        dict(num_splits=0),
        dict(num_splits=257),
        dict(k_strides=(4096, 260, 128)),
        dict(dtype=0, kv_dtype=0),
        dict(kv_dtype=2),
        dict(num_splits=2),
    ):
        code = call(**bad)
        assert code == -1 and "invalid argument" in lib.error_string(code), bad
    if not torch.cuda.is_available():
        code = call()
        assert code > 0 and lib.error_string(code)
        query = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
        cache = torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="must be on the query's CUDA device"):
            lib.paged_attention_decode(
                query, cache, cache, torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 0.125
            )
        with pytest.raises(ValueError, match="head_size must be one of"):
            lib.paged_attention_decode(
                query[..., :96],
                cache[..., :96],
                cache[..., :96],
                torch.zeros(1, 4, dtype=torch.int32),
                torch.ones(1, dtype=torch.int32),
                0.125,
            )


def test_cuda_argument_checks_name_the_argument():
    from llmconsole.kernels.checks import check_cuda_decode_args
    from llmconsole.kernels.kv_layout import cuda_kv_cache, split_cuda_kv_cache

    key, value = split_cuda_kv_cache(cuda_kv_cache(6, 2, 16, 128, torch.bfloat16), 128)
    query = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    table, lens = torch.zeros(3, 4, dtype=torch.int32), torch.ones(3, dtype=torch.int32)

    def check(**kw):
        args = dict(query=query, key_cache=key, value_cache=value, block_tables=table, seq_lens=lens, out=None)
        args.update(kw)
        check_cuda_decode_args(**args)

    cases = [
        (dict(query=query.float()), TypeError, "query dtype"),
        (dict(key_cache=key.float(), value_cache=value.float()), TypeError, "key_cache dtype"),
        (dict(key_cache=key[..., :64]), ValueError, "key_cache must be"),
        (dict(value_cache=value[:3]), ValueError, "must match"),
        (dict(query=query[:, :7]), ValueError, "multiple of num_kv_heads"),
        (dict(block_tables=table.long()), TypeError, "block_tables"),
        (dict(seq_lens=lens[:2]), TypeError, "seq_lens"),
        (dict(out=torch.zeros(3, 8, 128)), ValueError, "out must be"),
        ({}, ValueError, "must be on the query's CUDA device"),  # all valid, but on the CPU
    ]
    for kw, exc, words in cases:
        with pytest.raises(exc, match=words):
            check(**kw)
    small_blocks = split_cuda_kv_cache(cuda_kv_cache(6, 2, 8, 128, torch.bfloat16), 128)
    with pytest.raises(ValueError, match="block_size must be a positive multiple of 16"):
        check(key_cache=small_blocks[0], value_cache=small_blocks[1])
    odd = split_cuda_kv_cache(cuda_kv_cache(6, 2, 16, 96, torch.bfloat16), 96)
    with pytest.raises(ValueError, match="head_size must be one of"):
        check(query=torch.zeros(3, 8, 96, dtype=torch.bfloat16), key_cache=odd[0], value_cache=odd[1])
    fp8 = split_cuda_kv_cache(cuda_kv_cache(6, 2, 16, 128, torch.float8_e4m3fn), 128)
    with pytest.raises(ValueError, match="CUDA device"):  # fp8 caches pass the dtype check
        check(key_cache=fp8[0], value_cache=fp8[1])


def test_occupancy_arithmetic():
    # 128 threads, 126 registers: 4096 registers a warp, 4 warps a quarter-SM, 4 CTAs by registers;
    # 100352 + 256 bytes of shared memory + 1 KiB reserved: 2 CTAs in sm_90's 228 KiB, 1 in sm_80's.
    h100 = occupancy("sm_90", 128, 126, 256, 100352)
    assert h100.by_limit == {"threads": 16, "ctas": 32, "registers": 4, "shared memory": 2}
    assert (h100.ctas_per_sm, h100.warps_per_sm, h100.limited_by) == (2, 8, "shared memory")
    assert h100.occupancy == 8 / 64
    a100 = occupancy("sm_80", 128, 126, 256, 100352)
    assert (a100.ctas_per_sm, a100.limited_by) == (1, "shared memory")
    # Registers: 255 a thread round to 8192 a warp, 2 warps a quarter-SM: one 256-thread CTA.
    regs = occupancy("sm_90", 256, 255, 0, 0)
    assert (regs.ctas_per_sm, regs.limited_by) == (1, "registers")
    # Threads: 32 registers, no shared memory, 1024-thread CTAs: 2 by threads.
    assert occupancy("sm_80", 1024, 32, 0, 0).limited_by == "threads"
    # Too much shared memory for one CTA, too many registers for one thread.
    assert occupancy("sm_90", 128, 64, 0, 240 * 1024).limited_by == "does not fit: shared memory"
    assert occupancy("sm_80", 128, 300, 0, 0).ctas_per_sm == 0
    assert occupancy("sm_86", 128, 32, 0, 0).ctas_per_sm == 12  # 1536 threads an SM
    # The decode kernel's dynamic shared memory follows its geometry and the build options.
    name = "llmc::decode_kernel<__nv_bfloat16, __nv_bfloat16, 128, 1>"
    assert dynamic_smem(name, {"threads": 128}) == 4 * 3 * 8192 + 8 * 128 * 2
    assert dynamic_smem(name, {"threads": 256}) == 8 * 3 * 8192 + 8 * 128 * 2
    assert dynamic_smem("llmc::merge_kernel<__half>", {}) == 1024
    assert kernel_occupancy("sm_75", name, 100, 256, {}) is None


@needs_nvcc
def test_occupancy_of_the_default_build(default_build):
    options = default_build.options
    for arch in ("sm_80", "sm_90"):
        for name, r in default_build.resources[arch].items():
            occ = kernel_occupancy(arch, name, r.registers, r.shared_bytes, options)
            assert occ is not None and occ.ctas_per_sm >= 1, (arch, name, occ)
            assert occ.smem_bytes <= SM_LIMITS[arch].smem_per_cta
    # Head 128, up to 8 query heads a CTA: two CTAs (8 warps) per Hopper SM, one per A100 SM,
    # shared memory (the K/V stage rings) being what stops the next one.
    name = "llmc::decode_kernel<__nv_bfloat16, __nv_bfloat16, 128, 1>"
    for arch, ctas in (("sm_90", 2), ("sm_80", 1)):
        r = default_build.resources[arch][name]
        occ = kernel_occupancy(arch, name, r.registers, r.shared_bytes, options)
        assert occ is not None and (occ.ctas_per_sm, occ.limited_by) == (ctas, "shared memory"), (arch, occ)


@needs_nvcc
def test_kernel_info_reports_both_builds():
    info = kernel_info()
    assert set(info["cuda"]["archs"]) == {"sm_80", "sm_90"}
    assert info["cuda"]["error"] is None
    assert "cflags" in info["cpu"] and "built" in info["cpu"]
    assert set(info["cuda"]["occupancy"]) == {"sm_80", "sm_90"}
    occ = info["cuda"]["occupancy"]["sm_90"]["llmc::decode_kernel<__nv_bfloat16, __nv_bfloat16, 128, 1>"]
    assert occ["ctas_per_sm"] == 2 and occ["limited_by"] == "shared memory"
    text = format_kernel_info(info)
    assert "sm_90" in text and "llmc::decode_kernel<__nv_bfloat16, __nv_bfloat16, 128, 1>" in text
    assert "CTAs/SM" in text and "occupancy" in text and "shared memory" in text


def test_kernel_info_without_nvcc(monkeypatch):
    import llmconsole.kernels.cuda_build as cuda_build

    monkeypatch.setattr(cuda_build, "find_nvcc", lambda env=None: None)
    monkeypatch.setattr("llmconsole.kernels.info.find_nvcc", lambda env=None: None)
    info = kernel_info(build_cpu=False)
    assert "nvcc not found" in info["cuda"]["error"]
    assert "nvcc not found" in format_kernel_info(info)


# ---- the CLI ---------------------------------------------------------------------------------


@needs_nvcc
def test_cli_kernels_info_json(cli):
    info = json.loads(cli("kernels", "info", "--json").stdout)
    assert info["cpu"]["built"] is True and info["cpu"]["error"] is None
    assert "-mavx2" in info["cpu"]["cflags"]
    host = info["host"]
    # x86, bf16, block 128: vLLM picks AMX exactly where the CPU has it; the kernel's engines "vec".
    assert host["vllm_isa"] == ("amx" if host["amx_tiles"] else "vec"), host
    assert host["kernel_isa"] == "vec"
    assert info["cuda"]["error"] is None
    assert set(info["cuda"]["archs"]) == {"sm_80", "sm_90"}
    for kernels in info["cuda"]["archs"].values():
        assert set(kernels) == EXPECTED_KERNELS
        for r in kernels.values():
            assert r["registers"] > 0 and r["spill_store_bytes"] >= 0 and r["shared_bytes"] >= 0


@needs_nvcc
def test_cli_kernels_info_passes_build_knobs(cli):
    out = cli(
        "kernels", "info", "--no-build", "--arch", "sm_90", "--max-registers", "32", "--fast-math", "--head-size", "128"
    ).stdout
    assert "-maxrregcount=32" in out and "--use_fast_math" in out and "-DLLMC_ONLY_HEAD_SIZE=128" in out
    # Rows: arch, kernel name (with spaces), regs, spill st/ld, stack, smem, dyn smem, CTAs/SM, ...
    rows = [
        re.match(r"\s*(sm_\d+)\s+(llmc::.*?>)\s+(\d+)\s+(\d+)/(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", line)
        for line in out.splitlines()
        if line.strip().startswith("sm_")
    ]
    assert rows and all(rows)
    assert {r[1] for r in rows} == {"sm_90"}
    assert {r[2] for r in rows} == expected_kernels((128,))
    assert all(int(r[3]) <= 32 for r in rows)
    assert all(int(r[9]) >= 1 for r in rows)  # CTAs/SM


def test_cli_kernels_info_rejects_bad_knobs(cli):
    r = cli("kernels", "info", "--no-build", "--threads", "100", check=False)
    assert r.returncode == 2 and "multiple of 32" in r.stderr
    r = cli("kernels", "info", "--no-build", "--threads", "512", check=False)
    assert r.returncode == 2 and "[32, 256]" in r.stderr
