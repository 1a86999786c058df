"""What `llmconsole kernels info` reports: the CPU kernel's build, which of vLLM's CPU attention
ISAs this host runs (AMX or not), and the CUDA kernel's compiler resource report (registers,
spills, shared memory per kernel and target arch) with the occupancy those figures allow
(occupancy.py: CTAs and warps per SM, and the resource that limits them).

Nothing here needs a GPU: the CUDA report comes from compiling with nvcc for the listed archs.
A missing compiler is a value in the report (with the reason), never an exception.
"""

from __future__ import annotations

from typing import Any

from llmconsole.kernels.build import KernelBuildError, cpu_status, load_cpu_kernel
from llmconsole.kernels.cpu_isa import host_attention_isas
from llmconsole.kernels.cuda_build import (
    DEFAULT_ARCHS,
    CudaBuildError,
    CudaBuildOptions,
    compile_cuda,
    find_nvcc,
)
from llmconsole.kernels.occupancy import kernel_occupancy

_DEFAULT_OPTIONS = CudaBuildOptions()


def kernel_info(
    build_cpu: bool = True, cuda_options: CudaBuildOptions = _DEFAULT_OPTIONS, archs: tuple[str, ...] = DEFAULT_ARCHS
) -> dict[str, Any]:
    """{"cpu": build status, "host": cpu_isa.host_attention_isas(), "cuda": {nvcc, flags,
    options, error, archs: {arch: {kernel: {registers, spill_store_bytes, ...}}},
    occupancy: {arch: {kernel: occupancy.Occupancy.as_dict()}}}}. build_cpu=False reports
    without compiling."""
    if build_cpu:
        try:
            load_cpu_kernel()
        except KernelBuildError:
            pass  # recorded in the status
    cpu = cpu_status().as_dict()

    cuda: dict[str, Any] = {
        "nvcc": find_nvcc(),
        "options": cuda_options.as_dict(),
        "flags": cuda_options.nvcc_flags(),
        "error": None,
        "archs": {},
        "occupancy": {},
    }
    try:
        result = compile_cuda(cuda_options, archs=archs)
    except (CudaBuildError, OSError, ValueError) as exc:
        cuda["error"] = str(exc)
    else:
        report = result.as_dict()
        cuda.update(
            nvcc=report["nvcc"],
            nvcc_version=report["nvcc_version"],
            flags=report["flags"],
            fatbin=report["path"],
            archs=report["resources"],
        )
        for arch, kernels in result.resources.items():
            for name, r in kernels.items():
                occ = kernel_occupancy(arch, name, r.registers, r.shared_bytes, report["options"])
                if occ is not None:
                    cuda["occupancy"].setdefault(arch, {})[name] = occ.as_dict()
    return {"cpu": cpu, "host": host_attention_isas(), "cuda": cuda}


def format_kernel_info(info: dict[str, Any]) -> str:
    """A plain-text summary and one table row per (arch, kernel)."""
    cpu, cuda = info["cpu"], info["cuda"]
    lines = ["CPU kernel (AVX2 + FMA, OpenMP)"]
    if cpu.get("built"):
        lines.append(f"  built      yes, {cpu.get('library_path')}")
    else:
        lines.append(f"  built      no{': ' + cpu['error'] if cpu.get('error') else ''}")
    lines.append(f"  compiler   {cpu.get('compiler') or 'not found'}")
    lines.append(f"  flags      {' '.join(cpu.get('cflags') or [])}")
    if cpu.get("build_s") is not None:
        lines.append(f"  build/load {cpu['build_s']:.1f} s")
    host = info.get("host") or {}
    if host.get("vllm_isa"):
        lines.append(
            f"  vLLM's ISA {host['vllm_isa']} (bf16, head {host['head_size']}, block "
            f"{host['block_size']}; AMX tiles: {'yes' if host['amx_tiles'] else 'no'})"
        )
        if host["kernel_isa"] != host["vllm_isa"]:
            # Said where an operator looks before choosing --kernel custom: on such a host the
            # stock engine runs vLLM's AMX kernel, the custom one the kernel on the vec layout.
            lines.append(
                f"             a --kernel custom engine keeps vLLM's {host['kernel_isa']!r} KV "
                f"layout, the one the kernel reads, instead of {host['vllm_isa']!r}"
            )
    elif host.get("error"):
        lines.append(f"  vLLM's ISA unknown: {host['error']}")
    lines.append("")
    lines.append("CUDA kernel")
    lines.append(
        f"  nvcc       {cuda.get('nvcc') or 'not found'}"
        + (f" ({cuda['nvcc_version']})" if cuda.get("nvcc_version") else "")
    )
    lines.append(f"  flags      {' '.join(cuda.get('flags') or [])}")
    if cuda.get("error"):
        error_lines = [ln.strip() for ln in cuda["error"].splitlines() if ln.strip()]
        lines.append(f"  error      {error_lines[0]}")
        # The compiler's own complaint is the useful part of a failed build.
        cause = next((ln for ln in error_lines[1:] if "error" in ln.lower() or "fatal" in ln.lower()), None)
        if cause:
            lines.append(f"             {cause}")
        return "\n".join(lines)
    rows = [(arch, name, r) for arch, kernels in cuda["archs"].items() for name, r in kernels.items()]
    if not rows:
        return "\n".join(lines)
    occupancy = cuda.get("occupancy") or {}
    name_w = max(len("kernel"), *(len(n) for _, n, _ in rows))
    header = (
        f"  {'arch':<6}  {'kernel':<{name_w}}  {'regs':>4}  {'spill st/ld B':>13}  "
        f"{'stack B':>7}  {'smem B':>6}  {'dyn smem B':>10}  {'CTAs/SM':>7}  {'warps/SM':>8}  "
        f"{'occupancy':>9}  limited by"
    )
    lines += ["", header, "  " + "-" * (len(header) - 2)]
    for arch, name, r in rows:
        spill = f"{r['spill_store_bytes']}/{r['spill_load_bytes']}"
        row = (
            f"  {arch:<6}  {name:<{name_w}}  {r['registers']:>4}  {spill:>13}  "
            f"{r['stack_bytes']:>7}  {r['shared_bytes']:>6}"
        )
        occ = occupancy.get(arch, {}).get(name)
        if occ:
            dyn = occ["smem_bytes"] - r["shared_bytes"]
            row += (
                f"  {dyn:>10}  {occ['ctas_per_sm']:>7}  {occ['warps_per_sm']:>8}  "
                f"{occ['occupancy']:>9.0%}  {occ['limited_by']}"
            )
        lines.append(row)
    lines.append(
        "  (smem B: static shared memory from ptxas; dyn smem B: what a launch adds (the decode "
        "kernel's K/V stage rings and Q tile, the merge kernel's weights at 256 splits); "
        "CTAs/SM and occupancy: the occupancy calculator's arithmetic on these figures at "
        "the largest shared-memory carve-out, with the resource that stops one more CTA)"
    )
    return "\n".join(lines)
