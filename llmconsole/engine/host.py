"""The host probe: GPU gauges through NVML, host memory and engines' processes through psutil.

Every NVML call goes through engine/nvml.py, which turns any error (no library, no driver, no
GPU, a call the device does not support) into None, printed as "N/A". A host with no GPU shows
N/A gauges, never a traceback. The probe runs at 1 Hz inside a daemon whose budget is a fraction
of a percent of a core, so it caches: NVML is initialised once per process (and tried once), and
each engine's process tree is re-listed only every few seconds.

It also tells who listens on a TCP port (from /proc/net/tcp and the processes' open sockets), so
the supervisor can refuse an answer on an engine's port that does not come from that engine.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psutil

from llmconsole.engine.nvml import NVML, Nvml

_CHILDREN_REFRESH_S = 5.0


_T = TypeVar("_T")


def fmt_na(value: object, fmt: str = "{}") -> str:
    return "N/A" if value is None else fmt.format(value)


def _or_none(fn: Callable[..., _T], *args: object) -> _T | None:
    """Call `fn`; any failure is None (a missing value is a value, as NVML's are: engine/nvml.py)."""
    try:
        return fn(*args)
    except Exception:
        return None


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_gpu_pct: float | None
    utilization_memory_pct: float | None  # memory-bandwidth utilisation, as NVML reports it
    power_w: float | None
    temperature_c: float | None


@dataclass(frozen=True)
class HostSample:
    cpu_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    gpus: tuple[GpuSample, ...]
    nvml_available: bool
    nvml_error: str | None


@dataclass(frozen=True)
class ProcessSample:
    """An engine's whole tree (API server, engine core, workers) summed."""

    pid: int
    rss_bytes: int
    cpu_pct: float
    num_processes: int


class HostProbe:
    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml if nvml is not None else NVML  # the process's, initialised once for all
        self._trees: dict[int, tuple[float, list[psutil.Process]]] = {}
        psutil.cpu_percent(None)  # the first call only primes psutil's counter

    def _gpu(self, i: int) -> GpuSample:
        nv = self.nvml
        h = nv.call("nvmlDeviceGetHandleByIndex", i)
        mem = nv.call("nvmlDeviceGetMemoryInfo", h) if h is not None else None
        util = nv.call("nvmlDeviceGetUtilizationRates", h) if h is not None else None
        power_mw = nv.call("nvmlDeviceGetPowerUsage", h) if h is not None else None
        temp = nv.call("nvmlDeviceGetTemperature", h, 0) if h is not None else None  # 0: NVML_TEMPERATURE_GPU
        return GpuSample(
            index=i,
            name=nv.name_text(h),
            memory_used_bytes=getattr(mem, "used", None),
            memory_total_bytes=getattr(mem, "total", None),
            utilization_gpu_pct=getattr(util, "gpu", None),
            utilization_memory_pct=getattr(util, "memory", None),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temperature_c=temp,
        )

    def sample_gpus(self) -> tuple[GpuSample, ...]:
        if not self.nvml.ready():
            return ()
        n = self.nvml.call("nvmlDeviceGetCount") or 0
        return tuple(self._gpu(i) for i in range(n))

    def sample_host(self) -> HostSample:
        vm = _or_none(psutil.virtual_memory)
        return HostSample(
            cpu_pct=_or_none(psutil.cpu_percent, None),
            memory_used_bytes=(vm.total - vm.available) if vm is not None else None,
            memory_total_bytes=vm.total if vm is not None else None,
            gpus=self.sample_gpus(),
            nvml_available=self.nvml.ready(),
            nvml_error=self.nvml.error,
        )

    def _tree(self, pid: int) -> list[psutil.Process] | None:
        now = time.monotonic()
        cached = self._trees.get(pid)
        if cached is not None and now - cached[0] < _CHILDREN_REFRESH_S:
            return cached[1]
        try:
            root = cached[1][0] if cached else psutil.Process(pid)
            if not root.is_running():
                raise psutil.NoSuchProcess(pid)
            old = {p.pid: p for p in (cached[1] if cached else [])}
            # Keep the Process objects we had: psutil's cpu_percent needs the previous reading.
            procs = [root] + [old.get(c.pid, c) for c in root.children(recursive=True)]
        except psutil.Error:
            self._trees.pop(pid, None)
            return None
        self._trees[pid] = (now, procs)
        return procs

    def sample_process(self, pid: int) -> ProcessSample | None:
        """The engine's tree summed, or None if the process is gone."""
        procs = self._tree(pid)
        if procs is None:
            return None
        rss, cpu, alive = 0, 0.0, 0
        for p in procs:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    cpu += p.cpu_percent(None)
                alive += 1
            except psutil.Error:
                continue
        if alive == 0:
            self._trees.pop(pid, None)
            return None
        return ProcessSample(pid=pid, rss_bytes=rss, cpu_pct=cpu, num_processes=alive)

    def forget(self, pid: int) -> None:
        self._trees.pop(pid, None)


def tree_rss_bytes(pid: int) -> int | None:
    """The resident memory of the process `pid` and its descendants now, or None if it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


# --- who listens on a port ----------------------------------------------------------------------

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = b"0A"


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def listening_socket_inodes(port: int, host: str | None = None) -> frozenset[int] | None:
    """Inodes of the TCP sockets listening on `port` whose address overlaps `host`'s (IPv4 and
    IPv6), or None where the kernel's tables cannot be read (not Linux). Overlapping: the same
    address, a wildcard (0.0.0.0, ::) on either side, or any address when `host` is None or does
    not resolve. A listener on 127.0.0.2:PORT does not overlap an engine on 127.0.0.1:PORT: a
    client of the engine never reaches it, so it is no stranger on the engine's port.

    The kernel writes its listening sockets first, then every connection; the rows are made as
    they are read. So the read stops at the first row that is not listening, and the cost is the
    host's listeners, not its connections: under a flood of connections a full read of these
    tables takes tens of milliseconds, and the health check reads them every second. Finding
    nothing that way, it reads the whole tables before saying nothing listens."""
    addresses = host_addresses(host)
    found = _listening_rows(port, listeners_only=True, addresses=addresses)
    if found is not None and not found:
        found = _listening_rows(port, listeners_only=False, addresses=addresses)
    return found


def host_addresses(host: str | None) -> frozenset[Address] | None:
    """The addresses a socket bound to `host` listens on; None for any (a wildcard, or a name
    that does not resolve: then every listener on the port overlaps)."""
    if host is None or host in ("", "*"):
        return None
    try:
        addrs = {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return None
        addrs = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    if not addrs or any(a.is_unspecified for a in addrs):
        return None
    return frozenset(_plain(a) for a in addrs)


def _plain(addr: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _row_address(hex_addr: bytes) -> Address:
    """The kernel's hex local address (each 32-bit word in the host's byte order)."""
    raw = bytes.fromhex(hex_addr.decode())
    if sys.byteorder == "little":
        raw = b"".join(raw[k : k + 4][::-1] for k in range(0, len(raw), 4))
    return _plain(ipaddress.ip_address(raw))


def _overlaps(hex_addr: bytes, addresses: frozenset[Address] | None) -> bool:
    if addresses is None:
        return True
    try:
        addr = _row_address(hex_addr)
    except ValueError:
        return True  # a row we cannot read is not taken for someone else's
    return addr.is_unspecified or addr in addresses


def _listening_rows(
    port: int, *, listeners_only: bool, addresses: frozenset[Address] | None = None
) -> frozenset[int] | None:
    found: set[int] = set()
    readable = False
    for table in _TCP_TABLES:
        try:
            f = open(table, "rb")
        except OSError:
            continue
        readable = True
        with f:
            f.readline()  # the header
            for line in f:
                fields = line.split()
                if len(fields) < 10:
                    continue
                if fields[3] != _TCP_LISTEN:
                    if listeners_only:
                        break
                    continue
                try:
                    local, _, hex_port = fields[1].rpartition(b":")
                    if int(hex_port, 16) == port and _overlaps(local, addresses):
                        found.add(int(fields[9]))
                except ValueError:
                    continue
    return frozenset(found) if readable else None


def _socket_inodes_of(pid: int) -> set[int]:
    out: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def tree_socket_inodes(pid: int) -> set[int]:
    """Inodes of every socket the process `pid` and its descendants hold open."""
    try:
        root = psutil.Process(pid)
        pids = [pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.Error:
        return set()
    out: set[int] = set()
    for p in pids:
        out |= _socket_inodes_of(p)
    return out


def socket_holders(inodes: frozenset[int] | set[int]) -> list[str]:
    """'pid N (name)' for each process holding one of the sockets `inodes` (those we may see)."""
    if not inodes:
        return []
    out = []
    for p in psutil.process_iter(["pid", "name"]):
        if _socket_inodes_of(p.info["pid"]) & inodes:
            out.append(f"pid {p.info['pid']} ({p.info['name']})")
    return out
