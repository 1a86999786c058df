"""Compiling the CUDA decode kernel with nvcc and reading back what the compiler allotted.

No CUDA build of torch is needed: the .cu file has a plain extern "C" launcher, so it compiles
to a fatbin (device code only, for the resource report) or to a shared library (for a GPU host,
loaded with ctypes by bench/gpu_check.py). `-Xptxas -v` makes ptxas print, per kernel and per
target arch, the registers, spill bytes and shared memory it assigned; those numbers decide
occupancy, and the build options below exist to move them.

Results are cached under cache_dir()/cuda/<key>, keyed by source, options, archs and nvcc
version, so repeated reports (tests, `llmconsole kernels info`) cost nothing after the first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmconsole.atomic import write_atomic
from llmconsole.kernels.build import CSRC_DIR, cache_dir

CUDA_SOURCE = CSRC_DIR / "paged_attention.cu"
DEFAULT_ARCHS = ("sm_80", "sm_90")
HEAD_SIZES = (64, 128, 256)
MAX_THREADS = 256
# Part of the cache key: bump when the report format or its parsing changes.
_REPORT_FORMAT = 3


class CudaBuildError(RuntimeError):
    """nvcc is missing or the CUDA source did not compile; the message says which."""


@dataclass(frozen=True)
class CudaBuildOptions:
    """The kernel's tuning knobs. Each maps to a define or an nvcc flag (see the .cu header)."""

    warp_reduce: bool = True  # merge kernel: __shfl_xor_sync reductions, not a smem tree
    smem_carveout_kb: int = 0  # shared memory per SM to ask for; 0 = driver default
    max_registers: int | None = None  # -maxrregcount (drops __launch_bounds__, which overrides it)
    fast_math: bool = False  # --use_fast_math
    threads: int = 128  # threads per CTA: warps streaming one CTA's context
    partition_tokens: int = 128  # smallest context split the split chooser makes
    stage_bytes: int = 24576  # shared memory per warp for its ring of K/V stages
    only_head_size: int = 0  # 0: head sizes 64, 128, 256; N: only N (a faster build)
    fp8_kv: bool = True  # also build the fp8 e4m3 KV kernels

    def __post_init__(self) -> None:
        if self.threads % 32 or not 32 <= self.threads <= MAX_THREADS:
            raise ValueError(f"threads must be a multiple of 32 in [32, {MAX_THREADS}], got {self.threads}")
        if self.only_head_size not in (0, *HEAD_SIZES):
            raise ValueError(f"only_head_size must be 0 or one of {HEAD_SIZES}, got {self.only_head_size}")
        if self.partition_tokens < 16 or self.stage_bytes < 1024:
            raise ValueError("partition_tokens must be >= 16 and stage_bytes >= 1024")

    def defines(self) -> list[str]:
        return [
            f"-DLLMC_WARP_REDUCE={int(self.warp_reduce)}",
            f"-DLLMC_SMEM_CARVEOUT_KB={int(self.smem_carveout_kb)}",
            f"-DLLMC_NUM_THREADS={int(self.threads)}",
            f"-DLLMC_PARTITION_SIZE={int(self.partition_tokens)}",
            f"-DLLMC_STAGE_BYTES={int(self.stage_bytes)}",
            f"-DLLMC_LAUNCH_BOUNDS={0 if self.max_registers else 1}",
            f"-DLLMC_ONLY_HEAD_SIZE={int(self.only_head_size)}",
            f"-DLLMC_FP8_KV={int(self.fp8_kv)}",
        ]

    def nvcc_flags(self) -> list[str]:
        flags = ["-O3", "-std=c++17", *self.defines()]
        if self.max_registers:
            flags.append(f"-maxrregcount={int(self.max_registers)}")
        if self.fast_math:
            flags.append("--use_fast_math")
        return flags

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class KernelResources:
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int  # static shared memory; dynamic smem is sized at launch
    constant_bytes: int


@dataclass
class CudaBuildResult:
    path: str
    kind: str  # "fatbin" or "shared"
    archs: tuple[str, ...]
    nvcc: str
    nvcc_version: str
    flags: list[str]
    options: dict[str, Any]  # CudaBuildOptions.as_dict()
    resources: dict[str, dict[str, KernelResources]] = field(default_factory=dict)
    cached: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "archs": list(self.archs),
            "nvcc": self.nvcc,
            "nvcc_version": self.nvcc_version,
            "flags": self.flags,
            "options": self.options,
            "cached": self.cached,
            "resources": {
                arch: {name: dataclasses.asdict(r) for name, r in kernels.items()}
                for arch, kernels in self.resources.items()
            },
        }


def find_nvcc(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1] if out.strip() else "unknown"


def _gencode(archs: tuple[str, ...]) -> list[str]:
    flags = []
    for arch in archs:
        if not re.fullmatch(r"sm_\d+[a-z]?", arch):
            raise ValueError(f"target arch must look like sm_80, got {arch!r}")
        flags += ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]
    return flags


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def demangle(names: list[str]) -> dict[str, str]:
    """Readable kernel names (`llmc::decode_kernel<__nv_bfloat16, __nv_bfloat16, 128, 1>`) via c++filt when
    present; the mangled name otherwise."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run(
        [tool], input="\n".join(names), capture_output=True, text=True, check=False
    ).stdout.splitlines()
    if len(out) != len(names):
        return {n: n for n in names}
    # Drop the return type and parameter list: every kernel here is void(llmc::Params).
    return {n: re.sub(r"^void |\(.*\)$", "", d) for n, d in zip(names, out, strict=True)}


def parse_ptxas_report(text: str) -> dict[str, dict[str, KernelResources]]:
    """`-Xptxas -v` output -> {arch: {kernel: KernelResources}}, names demangled."""
    raw: dict[str, dict[str, dict[str, int]]] = {}  # arch -> mangled kernel name -> figures
    current: dict[str, int] | None = None
    for line in text.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            name, arch = entry.groups()
            current = raw.setdefault(arch, {}).setdefault(
                name, {"stack": 0, "spill_st": 0, "spill_ld": 0, "regs": 0, "smem": 0, "cmem": 0}
            )
            continue
        if current is None:
            continue
        props = _PROPS.search(line)
        if props:
            current["stack"], current["spill_st"], current["spill_ld"] = map(int, props.groups())
            continue
        used = _USED.search(line)
        if used:
            current["regs"] = int(used.group(1))
            smem = _SMEM.search(line)
            cmem = _CMEM.search(line)
            current["smem"] = int(smem.group(1)) if smem else 0
            current["cmem"] = int(cmem.group(1)) if cmem else 0
            current = None
    names = demangle(sorted({n for kernels in raw.values() for n in kernels}))
    return {
        arch: {
            names[name]: KernelResources(
                registers=v["regs"],
                spill_store_bytes=v["spill_st"],
                spill_load_bytes=v["spill_ld"],
                stack_bytes=v["stack"],
                shared_bytes=v["smem"],
                constant_bytes=v["cmem"],
            )
            for name, v in sorted(kernels.items())
        }
        for arch, kernels in sorted(raw.items())
    }


def _result_from_json(data: dict[str, Any]) -> CudaBuildResult:
    resources = {
        arch: {name: KernelResources(**r) for name, r in kernels.items()} for arch, kernels in data["resources"].items()
    }
    return CudaBuildResult(
        path=data["path"],
        kind=data["kind"],
        archs=tuple(data["archs"]),
        nvcc=data["nvcc"],
        nvcc_version=data["nvcc_version"],
        flags=data["flags"],
        options=data["options"],
        resources=resources,
        cached=True,
    )


def compile_cuda(
    options: CudaBuildOptions = CudaBuildOptions(),
    archs: tuple[str, ...] = DEFAULT_ARCHS,
    kind: str = "fatbin",
    out_dir: Path | None = None,
    timeout_s: float = 600,
) -> CudaBuildResult:
    """Compile paged_attention.cu for `archs` into a fatbin or a shared library (kind="shared",
    loadable with ctypes; links the CUDA runtime) and return its resource report."""
    if kind not in ("fatbin", "shared"):
        raise ValueError(f"kind must be 'fatbin' or 'shared', got {kind!r}")
    nvcc = find_nvcc()
    if nvcc is None:
        raise CudaBuildError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    gencode = _gencode(archs)
    version = nvcc_version(nvcc)
    flags = options.nvcc_flags()
    source = CUDA_SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                " ".join(flags).encode(),
                " ".join(archs).encode(),
                kind.encode(),
                version.encode(),
                str(_REPORT_FORMAT).encode(),
            ]
        )
    ).hexdigest()[:16]
    build_dir = Path(out_dir) if out_dir else cache_dir() / "cuda" / key
    suffix = ".fatbin" if kind == "fatbin" else ".so"
    target = build_dir / f"llmconsole_paged_attention{suffix}"
    report_file = build_dir / "report.json"
    if report_file.exists() and target.exists():
        try:
            return _result_from_json(json.loads(report_file.read_text()))
        except (KeyError, TypeError, ValueError):
            pass  # a report from another version of this module: rebuild
    build_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the cache entry and rename into place, so a concurrent build of the same key
    # (two test runs, a test and `kernels info`) never sees a half-written file.
    staging = build_dir / f".build-{os.getpid()}"
    staging.mkdir(exist_ok=True)
    staged = staging / target.name
    cmd = [nvcc, *flags, *gencode, "-Xptxas", "-v"]
    cmd += ["-fatbin"] if kind == "fatbin" else ["-shared", "-Xcompiler", "-fPIC"]
    cmd += ["-o", str(staged), str(CUDA_SOURCE)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CudaBuildError(f"nvcc timed out after {timeout_s:.0f} s: {' '.join(cmd)}") from exc
    log = proc.stdout + proc.stderr
    (build_dir / "nvcc.log").write_text(" ".join(cmd) + "\n" + log)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise CudaBuildError(f"nvcc failed (exit {proc.returncode}):\n{log[-4000:]}")
    os.replace(staged, target)
    shutil.rmtree(staging, ignore_errors=True)
    result = CudaBuildResult(
        path=str(target),
        kind=kind,
        archs=tuple(archs),
        nvcc=nvcc,
        nvcc_version=version,
        flags=flags,
        options=options.as_dict(),
        resources=parse_ptxas_report(log),
    )
    missing = [a for a in archs if a not in result.resources]
    if missing:
        raise CudaBuildError(f"no ptxas resource report for {missing}; nvcc output:\n{log[-4000:]}")
    write_atomic(report_file, json.dumps(result.as_dict(), indent=1), mode=0o644)
    return result
