"""`llmconsole kernels info`: the compiled paged-attention kernels on this host.

  llmconsole kernels info                      CPU build status; CUDA flags and, per target
                                               arch, each kernel's registers, spills, smem and
                                               the occupancy they allow (CTAs, warps per SM)
  llmconsole kernels info --json
  llmconsole kernels info --max-registers 64 --smem-carveout-kb 96 --fast-math --arch sm_90
  llmconsole kernels info --head-size 128      only the head-128 kernels (a faster build)

The CPU kernel is built (once, then cached) unless --no-build; the CUDA report comes from
nvcc alone, so it works on hosts without a GPU. A missing compiler is reported, not raised.
"""

from __future__ import annotations

import argparse
import json

from llmconsole.console.cli_common import EXIT_USAGE, CliError


def cmd_info(ns: argparse.Namespace) -> int:
    from llmconsole.kernels.cuda_build import DEFAULT_ARCHS, CudaBuildOptions
    from llmconsole.kernels.info import format_kernel_info, kernel_info

    try:
        if ns.threads % 32 or not 32 <= ns.threads <= 256:
            raise ValueError(f"--threads must be a multiple of 32 in [32, 256], got {ns.threads}")
        if ns.smem_carveout_kb < 0 or (ns.max_registers is not None and ns.max_registers < 16):
            raise ValueError("--smem-carveout-kb must be >= 0 and --max-registers >= 16")
        options = CudaBuildOptions(
            warp_reduce=not ns.no_warp_reduce,
            smem_carveout_kb=ns.smem_carveout_kb,
            max_registers=ns.max_registers,
            fast_math=ns.fast_math,
            threads=ns.threads,
            only_head_size=ns.head_size or 0,
        )
        info = kernel_info(
            build_cpu=not ns.no_build, cuda_options=options, archs=tuple(ns.arch) if ns.arch else DEFAULT_ARCHS
        )
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    print(json.dumps(info, indent=1) if ns.json else format_kernel_info(info))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = sub.add_parser("kernels", help="the compiled paged-attention kernels: build status and CUDA resource report")
    ksub = k.add_subparsers(dest="kernels_cmd", required=True)
    info = ksub.add_parser(
        "info",
        help="CPU build status; CUDA build flags and per-arch registers, spill bytes, shared memory and occupancy",
    )
    info.add_argument("--json", action="store_true")
    info.add_argument("--no-build", action="store_true", help="report the CPU kernel's state without compiling it")
    info.add_argument(
        "--arch", action="append", metavar="sm_XX", help="CUDA target arch (repeatable; default sm_80 and sm_90)"
    )
    info.add_argument("--max-registers", type=int, metavar="N", help="-maxrregcount=N")
    info.add_argument(
        "--smem-carveout-kb",
        type=int,
        default=0,
        metavar="KB",
        help="shared memory carve-out per SM to request (0: driver default)",
    )
    info.add_argument("--fast-math", action="store_true", help="--use_fast_math")
    info.add_argument(
        "--no-warp-reduce",
        action="store_true",
        help="shared-memory tree reductions in the split merge instead of warp shuffles",
    )
    info.add_argument(
        "--threads", type=int, default=128, help="threads per CTA, a multiple of 32 up to 256 (default 128)"
    )
    info.add_argument(
        "--head-size",
        type=int,
        choices=(64, 128, 256),
        metavar="N",
        help="build only the kernels for this head size (64, 128 or 256; faster)",
    )
    info.set_defaults(func=cmd_info)
