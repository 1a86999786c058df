"""How many CTAs of each CUDA kernel fit on one SM, from the compiler's figures alone.

The arithmetic of CUDA's occupancy calculator (cuda_occupancy.h) for the limits that matter
here: threads, CTA slots, registers (allocated per warp in units of 256, per quarter-SM
sub-partition) and shared memory (static + dynamic + the 1 KiB the runtime reserves per CTA,
in units of 128 bytes). The registers and static shared memory come from ptxas's report; the
decode kernel's dynamic shared memory from its geometry (cuda_emulation.kernel_geometry, which
the CPU suite checks against the compiled library). No GPU is needed; on one, the runtime's
own answer is llmc_paged_attention_ctas_per_sm().
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from llmconsole.kernels.cuda_emulation import MAX_SPLITS, kernel_geometry


@dataclass(frozen=True)
class SmLimits:
    """Per-SM resources of one target architecture (CUDA C Programming Guide, compute
    capabilities table)."""

    arch: str
    max_threads: int
    max_ctas: int
    registers: int = 65536
    max_registers_per_thread: int = 255
    register_unit: int = 256  # registers are allocated per warp in this unit
    sub_partitions: int = 4
    smem_per_sm: int = 0  # the largest carve-out, bytes
    smem_per_cta: int = 0  # the opt-in maximum for one CTA, bytes
    smem_unit: int = 128
    smem_reserved_per_cta: int = 1024


SM_LIMITS = {
    "sm_80": SmLimits("sm_80", max_threads=2048, max_ctas=32, smem_per_sm=164 * 1024, smem_per_cta=163 * 1024),
    "sm_86": SmLimits("sm_86", max_threads=1536, max_ctas=16, smem_per_sm=100 * 1024, smem_per_cta=99 * 1024),
    "sm_89": SmLimits("sm_89", max_threads=1536, max_ctas=24, smem_per_sm=100 * 1024, smem_per_cta=99 * 1024),
    "sm_90": SmLimits("sm_90", max_threads=2048, max_ctas=32, smem_per_sm=228 * 1024, smem_per_cta=227 * 1024),
}


@dataclass(frozen=True)
class Occupancy:
    threads: int
    registers: int
    smem_bytes: int  # static + dynamic per CTA
    ctas_per_sm: int
    warps_per_sm: int
    occupancy: float  # resident warps / the SM's maximum
    limited_by: str  # "threads", "ctas", "registers", "shared memory" or "does not fit: ..."
    by_limit: dict[str, int]  # CTAs per SM each resource alone allows

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(arch: str, threads: int, registers: int, static_smem: int, dynamic_smem: int) -> Occupancy:
    """CTAs of one kernel resident per SM, and which resource stops the next one."""
    lim = SM_LIMITS[arch]
    warps = -(-threads // 32)
    smem = static_smem + dynamic_smem
    by_limit = {"threads": lim.max_threads // (warps * 32), "ctas": lim.max_ctas}
    if registers > lim.max_registers_per_thread:
        by_limit["registers"] = 0
    else:
        per_warp = _round_up(max(registers, 1) * 32, lim.register_unit)
        warps_per_partition = lim.registers // lim.sub_partitions // per_warp
        by_limit["registers"] = warps_per_partition * lim.sub_partitions // warps
    if smem > lim.smem_per_cta:
        by_limit["shared memory"] = 0
    else:
        by_limit["shared memory"] = lim.smem_per_sm // _round_up(smem + lim.smem_reserved_per_cta, lim.smem_unit)
    ctas = min(by_limit.values())
    limited_by = min(by_limit, key=lambda k: (by_limit[k], list(by_limit).index(k)))
    if ctas == 0:
        limited_by = f"does not fit: {limited_by}"
    max_warps = lim.max_threads // 32
    return Occupancy(
        threads=threads,
        registers=registers,
        smem_bytes=smem,
        ctas_per_sm=ctas,
        warps_per_sm=ctas * warps,
        occupancy=ctas * warps / max_warps,
        limited_by=limited_by,
        by_limit=by_limit,
    )


_DECODE = re.compile(r"decode_kernel<(?P<q>[\w:]+), (?P<kv>[\w:]+), (?P<d>\d+), (?P<nt>\d+)>")


def dynamic_smem(kernel: str, options: dict[str, Any]) -> int:
    """Dynamic shared memory a launch of `kernel` (a demangled name from the ptxas report) asks
    for under these build options (CudaBuildOptions.as_dict()): the decode kernel's stage rings
    and Q tile, or the merge kernel's split weights at the most splits."""
    match = _DECODE.search(kernel)
    if match:
        geom = kernel_geometry(
            int(match["d"]),
            8 if match["nt"] == "1" else 16,
            1 if "fp8" in match["kv"] else 2,
            int(options.get("threads", 128)),
            int(options.get("stage_bytes", 24576)),
            int(options.get("partition_tokens", 128)),
        )
        return geom.cta_bytes
    if "merge_kernel" in kernel:
        return 4 * MAX_SPLITS
    return 0


def kernel_occupancy(
    arch: str, kernel: str, registers: int, static_smem: int, options: dict[str, Any]
) -> Occupancy | None:
    """Occupancy of one reported kernel, or None for an arch without a limits entry."""
    if arch not in SM_LIMITS:
        return None
    return occupancy(arch, int(options.get("threads", 128)), registers, static_smem, dynamic_smem(kernel, options))
