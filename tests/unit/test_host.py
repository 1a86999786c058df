"""The host probe on a machine without a GPU, and the NVML wrapper's error handling."""

import os
import signal
import subprocess
import sys
import time

import pytest

from llmconsole.engine import host as host_mod
from llmconsole.engine.host import HostProbe, fmt_na
from llmconsole.engine.nvml import Nvml
from tests.support.waiting import wait_until


def test_no_gpu_means_na_never_an_exception():
    probe = HostProbe()
    s = probe.sample_host()
    if s.nvml_available:
        pytest.skip("this machine has a working NVML; the no-GPU path is what is tested here")
    assert s.gpus == () and s.nvml_error
    assert s.memory_total_bytes > s.memory_used_bytes > 0
    assert fmt_na(None) == "N/A" and fmt_na(3, "{}%") == "3%"


def test_nvml_errors_become_none(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def boom(*a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)  # pretend NVML initialises; every device call then fails
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", boom)
    nv = Nvml(pynvml)
    assert nv.call("nvmlDeviceGetMemoryInfo", None) is None
    probe = HostProbe(nv)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: object())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    for fn in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetName",
    ):
        monkeypatch.setattr(pynvml, fn, boom)
    (gpu,) = probe.sample_gpus()
    assert gpu.memory_used_bytes is None and gpu.utilization_gpu_pct is None and gpu.power_w is None


def _spawn_tree(child_code: str) -> subprocess.Popen:
    """A parent with one child, in a session of its own so the test can end the whole tree."""
    code = (
        f"import subprocess, sys, time\nk = subprocess.Popen([sys.executable, '-c', {child_code!r}])\ntime.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _end_tree(parent: subprocess.Popen) -> None:
    try:
        os.killpg(parent.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    parent.wait()


def _wait_for(probe: HostProbe, pid: int, ok, timeout_s: float = 20.0):
    def sample():
        probe.forget(pid)  # re-list the children now rather than after the refresh period
        return probe.sample_process(pid)

    return wait_until(sample, timeout_s, 0.2, f"process {pid}'s tree", ok=lambda s: s is not None and ok(s))


def test_process_tree_is_summed_and_gone_is_none():
    parent = _spawn_tree("x = bytearray(50_000_000); import time; time.sleep(60)")
    probe = HostProbe()
    try:
        s = _wait_for(probe, parent.pid, lambda s: s.num_processes >= 2 and s.rss_bytes >= 50_000_000)
        assert s.num_processes == 2
        assert s.rss_bytes > 50_000_000  # the child's 50 MB counts toward the engine
        mine = probe.sample_process(os.getpid())
        assert mine.pid == os.getpid() and mine.num_processes >= 1 and mine.rss_bytes > 10_000_000
    finally:
        _end_tree(parent)
    probe.forget(parent.pid)
    assert probe.sample_process(parent.pid) is None
    assert probe.sample_process(2**22 + 12345) is None  # above any pid_max: never existed


def test_cpu_pct_is_measured_between_calls_on_the_same_processes():
    parent = _spawn_tree("while True: pass")
    probe = HostProbe()
    try:
        _wait_for(probe, parent.pid, lambda s: s.num_processes >= 2)
        time.sleep(1.0)
        s = probe.sample_process(parent.pid)  # same cached Process objects: a real interval
        assert s.num_processes == 2
        assert s.cpu_pct > 1.0, s  # the spinning child (little of a core on a busy host); 0.0: no previous reading
    finally:
        _end_tree(parent)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="the kernel's TCP tables are Linux's /proc")
def test_listeners_are_found_among_many_connections_and_a_port_with_only_connections_has_none():
    """The read stops at the first row that is not listening (the kernel lists listeners first):
    a listener is still found with hundreds of connections open beside it, and a port whose
    listener has closed but whose connections remain answers empty, from the whole table."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    port = srv.getsockname()[1]
    ours = os.fstat(srv.fileno()).st_ino
    pairs = []
    try:
        for _ in range(300):
            c = socket.create_connection(("127.0.0.1", port))
            pairs.append((c, srv.accept()[0]))
        assert host_mod.listening_socket_inodes(port) == frozenset({ours})
        srv.close()  # the connections stay, on the same port, and none of them listens
        assert host_mod.listening_socket_inodes(port) == frozenset()
    finally:
        srv.close()
        for a, b in pairs:
            a.close()
            b.close()


def test_the_listener_read_stops_at_the_first_connection_row_and_the_whole_table_backs_an_empty_answer(
    tmp_path, monkeypatch
):
    """Rows as the kernel writes them, but with a listener placed after a connection (which the
    kernel never does): the fast read stops before it, and the whole-table read that backs an
    empty answer still finds it. Port 0x1F90 is 8080."""
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

    def row(sl: int, local: str, remote: str, state: str, inode: int) -> str:
        return f"{sl:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  1000        0 {inode}\n"

    table = tmp_path / "tcp"
    table.write_text(
        header
        + row(0, "0100007F:0016", "00000000:0000", "0A", 11)  # a listener on another port
        + row(1, "0100007F:1F90", "0100007F:D431", "01", 12)  # a connection on 8080
        + row(2, "0100007F:1F90", "00000000:0000", "0A", 13)  # a listener on 8080, out of order
    )
    monkeypatch.setattr(host_mod, "_TCP_TABLES", (str(table),))
    assert host_mod._listening_rows(8080, listeners_only=True) == frozenset()
    assert host_mod._listening_rows(22, listeners_only=True) == frozenset({11})
    assert host_mod.listening_socket_inodes(8080) == frozenset({13})
    monkeypatch.setattr(host_mod, "_TCP_TABLES", (str(tmp_path / "absent"),))
    assert host_mod.listening_socket_inodes(8080) is None  # no tables: cannot tell


def test_only_a_listener_whose_address_overlaps_the_engines_counts(tmp_path, monkeypatch):
    """Rows of listeners on port 8080 (0x1F90) at several addresses, as the kernel writes them
    on a little-endian host: an engine on 127.0.0.1 shares its port with the one on 127.0.0.1
    and the wildcards (0.0.0.0, ::, an IPv4-mapped 127.0.0.1), never with 127.0.0.2 or ::1."""

    if sys.byteorder != "little":
        pytest.skip("the rows below are written as a little-endian kernel writes them")
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

    def row(sl: int, local: str, inode: int) -> str:
        return f"{sl:4d}: {local}:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 {inode}\n"

    v4 = tmp_path / "tcp"
    v4.write_text(header + row(0, "0100007F", 1) + row(1, "0200007F", 2) + row(2, "00000000", 3))
    v6 = tmp_path / "tcp6"
    v6.write_text(
        header
        + row(0, "00000000000000000000000001000000", 4)  # ::1
        + row(1, "00000000000000000000000000000000", 5)  # ::
        + row(2, "0000000000000000FFFF00000100007F", 6)  # ::ffff:127.0.0.1
    )
    monkeypatch.setattr(host_mod, "_TCP_TABLES", (str(v4), str(v6)))
    assert host_mod.listening_socket_inodes(8080, "127.0.0.1") == frozenset({1, 3, 5, 6})
    assert host_mod.listening_socket_inodes(8080, "127.0.0.2") == frozenset({2, 3, 5})
    assert host_mod.listening_socket_inodes(8080, "::1") == frozenset({3, 4, 5})
    # A wildcard engine, no host, or a name that does not resolve: every listener on the port.
    for host in ("0.0.0.0", "::", None, "no-such-host.invalid"):
        assert host_mod.listening_socket_inodes(8080, host) == frozenset(range(1, 7)), host
