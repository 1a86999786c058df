"""Hosts that are other hosts: each a Linux network namespace with an address of its own, its own
sshd, its own Unix user and home, and llmconsole installed on its PATH; the operator reaches them
only through an ssh client config naming them, as one names real hosts.

A `NetnsHost` is:
- a network namespace (`llmct-PID-N`) joined to this machine by a veth pair addressed from the
  benchmarking range 198.18.0.0/15, one /30 per host (this machine's end .1, the host's .2). The
  namespace has no default route: its traffic goes to this machine's end of the pair and nowhere
  else, never off the machine;
- a Unix user of its own (`llmct-PID-N`) with a home of its own; llmconsole's data dir there is
  the default one (~/.local/share/llmconsole) and its control socket /tmp/llmconsole-UID;
- a filesystem view of its own (the mount namespace `ip netns exec` makes): /usr/local/bin holds
  `llmconsole` alone, where `pip install llmconsole` as root would put it, so the default remote
  command (`llmconsole` on the login PATH) is the one that runs. That `llmconsole` is a two-line
  script running the suite's interpreter on the tree under test (PYTHONPATH): a real install's
  console script runs its own venv's interpreter on the installed package instead. The
  interpreter's own directory is made readable there when this machine keeps it where other
  users cannot read (a Python under /root), and so are the tree and its venv (a clone in a
  `mktemp -d` folder, mode 0700);
- an sshd in that namespace on port 22 of its address, with the user's ~/.ssh/authorized_keys,
  StrictModes and every other default of sshd's own;
- a copy of the tiny model in the user's home (the operator's copy is readable by root only), at
  `host.model`, a path as that host sees it.

The operator side: the test's key pair and a known_hosts file with the hosts' keys, and one ssh
client config file, /etc/ssh/ssh_config.d/llmct-PID-N.conf (Debian's ssh_config includes that
folder), with a `Host` block per host (HostName, User, IdentityFile, UserKnownHostsFile): plain
`ssh ALIAS` reaches it, so llmconsole runs the ssh it finds, with no LLMCONSOLE_SSH_COMMAND. The
aliases (`host.alias`) carry the process id, so fleets of parallel test workers never meet.

Everything is undone by `NetnsFleet.close()` (the fixture's finalizer), else at the interpreter's
exit (atexit), else by the next fleet made on this machine: it sweeps the namespaces, users,
links, config files and folders whose process id no longer runs. Where namespaces cannot be made
(not root) the tests skip saying so; in CI they fail instead (CI runs as root and must run them).

    def test_x(netns_fleet):
        beta = netns_fleet.host("beta")       # reachable as `ssh beta.alias`
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.support.tools import find_tool, in_ci

PREFIX = "llmct"
NETWORK = ipaddress.ip_network("198.18.0.0/15")
SSH_CONFIG_DIR = Path("/etc/ssh/ssh_config.d")
LOCK_FILE = Path("/run/llmct-netns.lock")
# Names this harness gives: namespaces and users llmct-PID-N, veth ends lctPIDhN / lctPIDnN,
# client configs llmct-PID-N.conf, folders /tmp/llmct-PID-*.
_OWNED = re.compile(rf"^{PREFIX}-(\d+)-\d+$")
_LINK = re.compile(r"^lct(\d+)[hn]\d+$")
_FILE = re.compile(rf"^{PREFIX}-(\d+)-")

_live: list[NetnsFleet] = []


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair without a passphrase; returns the public key line."""
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return Path(f"{path}.pub").read_text().strip()


def namespace_pids(ns: str) -> set[int]:
    """The processes whose network namespace is `ns`."""
    return {int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()}


def why_not_possible() -> str | None:
    """None where this process can make network namespaces; else what is missing."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces, veth pairs and users needs root"
    for tool in ("ip", "useradd", "userdel", "sshd", "ssh", "curl"):
        if find_tool(tool) is None:
            return f"{tool} is not installed (iproute2, passwd, openssh-server, openssh-client, curl)"
    if not SSH_CONFIG_DIR.is_dir():
        return f"{SSH_CONFIG_DIR} does not exist: this machine's ssh_config includes no folder of configs"
    probe = f"{PREFIX}-{os.getpid()}-0"  # no host has index 0; swept like the others
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def require_netns() -> None:
    why = why_not_possible()
    if why is None:
        return
    if in_ci():
        pytest.fail(f"{why}: CI runs as root and must run the tests of hosts in namespaces", pytrace=False)
    pytest.skip(f"hosts in network namespaces cannot be made here: {why}")


def _alive(pid: int) -> bool:
    return pid == os.getpid() or psutil.pid_exists(pid)


def _kill_namespace_processes(ns: str) -> None:
    """Every process in the namespace: TERM, then KILL what is left after a few seconds."""
    procs = []
    for pid in namespace_pids(ns):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            p.send_signal(signal.SIGCONT)  # a stopped process takes no TERM
            p.terminate()
            procs.append(p)
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def _remove_user(name: str) -> None:
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    for p in psutil.process_iter(["uids"]):  # a process of the user outside the namespace
        with contextlib.suppress(psutil.Error):
            if p.info["uids"] and p.info["uids"].real == uid:
                p.kill()
    _run("userdel", name, check=False)
    shutil.rmtree(f"/tmp/llmconsole-{uid}", ignore_errors=True)
    shutil.rmtree(f"/tmp/torchinductor_{name}", ignore_errors=True)  # torch's cache, per user name


def sweep() -> None:
    """Remove what a fleet of a process that no longer runs left behind (a test killed outright)."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _OWNED.match(name)
        if m and not _alive(int(m.group(1))):
            _kill_namespace_processes(name)
            _run("ip", "netns", "del", name, check=False)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            m = _LINK.match(name)
            if m and not _alive(int(m.group(1))):
                _run("ip", "link", "del", name, check=False)
    for user in pwd.getpwall():
        m = _OWNED.match(user.pw_name)
        if m and not _alive(int(m.group(1))):
            _remove_user(user.pw_name)
    for folder in (SSH_CONFIG_DIR, Path(tempfile.gettempdir())):
        for path in [*folder.glob(f"{PREFIX}-*"), *folder.glob(f"torchinductor_{PREFIX}-*")]:
            m = _FILE.match(path.name.removeprefix("torchinductor_"))
            if m and not _alive(int(m.group(1))):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


def _private_ancestor(path: Path) -> Path | None:
    """The outermost folder above `path` that other users cannot enter (e.g. /root), if any."""
    return next(iter(_private_ancestors(path)), None)


def _private_ancestors(path: Path) -> list[Path]:
    """Every folder on the way to `path` (itself too, if a folder) that other users cannot enter,
    the outermost first."""
    on_the_way = [*reversed(path.parents), *([path] if path.is_dir() else [])]
    return [p for p in on_the_way if p != Path("/") and not os.stat(p).st_mode & 0o001]


def _open_up(folder: Path, stage: Path) -> list[str]:
    """Shell lines that make `folder` enterable in a mount namespace and leave what it holds as it
    is: a tmpfs of mode 0755 over it, each entry bound back from a bind of the original."""
    q = shlex.quote
    lines = [
        f"mount --bind {q(str(folder))} {q(str(stage))}",
        f"mount -t tmpfs -o mode=0755,size=1m {PREFIX} {q(str(folder))}",
    ]
    for entry in sorted(folder.iterdir()):
        to, back = q(str(entry)), q(str(stage / entry.name))
        if entry.is_symlink():
            lines.append(f"ln -s {q(os.readlink(entry))} {to}")
        else:
            lines += [f"mkdir {to}" if entry.is_dir() else f"touch {to}", f"mount --bind {back} {to}"]
    return lines


class NetnsHost:
    def __init__(self, fleet: NetnsFleet, name: str, index: int, slot: ipaddress.IPv4Network):
        self.fleet, self.name = fleet, name
        pid = os.getpid()
        self.ns = f"{PREFIX}-{pid}-{index}"
        self.user = self.ns
        self.alias = f"{PREFIX}-{pid}-{name}"
        self.link, self.peer = f"lct{pid}h{index}", f"lct{pid}n{index}"
        hosts = list(slot.hosts())
        self.near, self.address = str(hosts[0]), str(hosts[1])  # this machine's end, the host's
        self.dir = fleet.root / name  # root's: sshd's config and keys, the host's home under it
        self.dir.mkdir(mode=0o755)
        self.home = self.dir / "home"
        self.proc: subprocess.Popen[bytes] | None = None
        self.uid = self.gid = -1
        self.host_public = ""
        self._made_user = self._made_ns = False

    # --- making it ---------------------------------------------------------------------

    def create(self) -> None:
        _run("ip", "netns", "add", self.ns)
        self._made_ns = True
        _run("ip", "link", "add", self.link, "type", "veth", "peer", "name", self.peer, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.near}/30", "dev", self.link)
        _run("ip", "link", "set", self.link, "up")
        _run("ip", "-n", self.ns, "addr", "add", f"{self.address}/30", "dev", self.peer)
        _run("ip", "-n", self.ns, "link", "set", self.peer, "up")
        _run("ip", "-n", self.ns, "link", "set", "lo", "up")
        _run(
            "useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(self.home),
            "--shell", "/bin/sh", self.user,
        )  # fmt: skip
        self._made_user = True
        # '*': no password and not locked (sshd without PAM refuses a locked account's keys too)
        _run("usermod", "-p", "*", self.user)
        pw = pwd.getpwnam(self.user)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True)
        (ssh_dir / "authorized_keys").write_text(self.fleet.client_public + "\n")
        models = self.home / "models"
        shutil.copytree(self.fleet.model_source, models / "tiny") if self.fleet.model_source else models.mkdir()
        self.model = models / "tiny"
        for path in [self.home, *self.home.rglob("*")]:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)
        os.chmod(self.home, 0o700)
        os.chmod(ssh_dir, 0o700)
        self._write_sshd_config()
        self._write_install()

    def _write_sshd_config(self) -> None:
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.host_public = keygen(self.host_key, f"{self.name}-host")
        self.sshd_config = self.dir / "sshd_config"
        self.sshd_config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.address}:22",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    f"AllowUsers {self.user}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "PrintMotd no",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )

    def _write_install(self) -> None:
        """/usr/local/bin as this host has it (the llmconsole console script), and the shell
        script that lays out the host's filesystem view, then runs sshd in it."""
        tree = os.environ.get("PYTHONPATH") or str(Path(__file__).resolve().parents[2])
        self.bin = self.dir / "bin"
        self.bin.mkdir(mode=0o755)
        script = self.bin / "llmconsole"
        script.write_text(
            "#!/bin/sh\n"
            "# llmconsole as installed on this host: the suite's interpreter on the tree under test\n"
            f"PYTHONPATH={tree}; export PYTHONPATH\n"
            f'exec {sys.executable} -m llmconsole.console.cli "$@"\n'
        )
        script.chmod(0o755)
        lines = ["set -e", f"mount --bind {self.bin} /usr/local/bin"]
        # The tree and the venv where others cannot enter (a clone in a `mktemp -d` folder, mode
        # 0700): the folders on the way are opened, their contents as they are.
        beside = [Path(sys.executable).parent, Path(sys.prefix), Path(tree)]
        opened = sorted({a for p in beside for a in _private_ancestors(p)}, key=lambda a: len(a.parts))
        for i, folder in enumerate(opened):
            stage = self.dir / f"open-{i}"
            stage.mkdir()
            lines += _open_up(folder, stage)
        python = Path(os.path.realpath(sys.executable))
        private = _private_ancestor(python)
        # The interpreter lives where others cannot enter (and no folder above was opened): show
        # its prefix alone.
        if private is not None and private not in opened:
            prefix = Path(os.path.realpath(sys.base_prefix))
            stage = self.dir / "python-stage"
            stage.mkdir()
            lines += [
                f"mount --bind {prefix} {stage}",
                f"mount -t tmpfs -o mode=0755,size=1m {PREFIX} {private}",
                f"mkdir -p {prefix}",
                f"mount --bind {stage} {prefix}",
            ]
        lines.append(f"mkdir -p /run/sshd && exec {find_tool('sshd')} -D -e -f {self.sshd_config}")
        self.boot = self.dir / "boot.sh"
        self.boot.write_text("\n".join(lines) + "\n")

    @property
    def known_hosts_line(self) -> str:
        kind, key = self.host_public.split()[:2]
        return f"{self.address} {kind} {key}"

    @property
    def client_config(self) -> str:
        return "\n".join(
            [
                f"Host {self.alias}",
                f"  HostName {self.address}",
                f"  User {self.user}",
                f"  IdentityFile {self.fleet.client_key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.fleet.known_hosts}",
                "  StrictHostKeyChecking yes",
                "",
            ]
        )

    # --- its sshd: the host on and off the network ------------------------------------

    def start(self, timeout_s: float = 15.0) -> None:
        log = open(self.dir / "sshd.log", "ab")
        try:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, "sh", str(self.boot)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd of {self.name} exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection((self.address, 22), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd of {self.name} did not listen on {self.address}:22: {self.log_tail()}")

    def log_tail(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        """The host goes off the network as far as ssh is concerned: its sshd and every open
        session end; what the sessions started (its daemon, its engines) keeps running."""
        if self.proc is None:
            return
        try:
            sessions = psutil.Process(self.proc.pid).children(recursive=True)
            sessions = [p for p in sessions if p.name().startswith("sshd")]
        except psutil.Error:
            sessions = []
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for p in sessions:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(sessions, timeout=5)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- looking at it ----------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """llmconsole's default data dir for this host's user."""
        return self.home / ".local" / "share" / "llmconsole"

    @property
    def runtime_dir(self) -> Path:
        """Where its control socket is: the user's private folder in /tmp (no XDG_RUNTIME_DIR in
        an ssh session without PAM)."""
        return Path(f"/tmp/llmconsole-{self.uid}")

    def write_file(self, path: Path, text: str) -> None:
        """A file of the host's user (0600), its missing folders made theirs (0700) on the way."""
        missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
        for folder in reversed(missing):
            folder.mkdir(mode=0o700)
            os.chown(folder, self.uid, self.gid)
        path.write_text(text)
        os.chown(path, self.uid, self.gid)
        path.chmod(0o600)

    def http_status(self, url: str) -> int:
        """GET `url` from inside the host, whose loopback is its own: the status (0: no answer)."""
        argv = ["ip", "netns", "exec", self.ns, "curl", "-s", "-o", "/dev/null", "-m", "10", "-w", "%{http_code}", url]
        return int(_run(*argv, check=False).stdout.strip() or 0)

    def daemon_pid(self) -> int:
        return int((self.runtime_dir / "daemon.pid").read_text())

    def destroy(self) -> None:
        self.stop()
        if self._made_ns:
            _kill_namespace_processes(self.ns)
            _run("ip", "netns", "del", self.ns, check=False)
            self._made_ns = False
        _run("ip", "link", "del", self.link, check=False)
        if self._made_user:
            _remove_user(self.user)
            self._made_user = False


class NetnsFleet:
    """Hosts by name, and the client side that reaches them: a key, known_hosts, an ssh config."""

    _count = 0

    def __init__(self, model_source: Path | None = None):
        sweep()
        NetnsFleet._count += 1
        self.id = f"{PREFIX}-{os.getpid()}-{NetnsFleet._count}"
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{os.getpid()}-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # the hosts' homes are under it; the client's folder is not
        client = self.root / "client"
        client.mkdir(mode=0o700)
        self.client_key = client / "id_ed25519"
        self.client_public = keygen(self.client_key, "operator")
        self.known_hosts = client / "known_hosts"
        self.known_hosts.write_text("")
        self.ssh_config = SSH_CONFIG_DIR / f"{self.id}.conf"
        self.model_source = model_source
        self.hosts: dict[str, NetnsHost] = {}
        _live.append(self)

    def host(self, name: str) -> NetnsHost:
        """A started host, reachable as `ssh HOST.alias`."""
        if name not in self.hosts:
            with open(LOCK_FILE, "a") as lock:  # address slots are picked by one fleet at a time
                fcntl.flock(lock, fcntl.LOCK_EX)
                host = NetnsHost(self, name, self._next_index(), self._free_slot())
                self.hosts[name] = host
                try:
                    host.create()
                finally:
                    self._write_client()
            host.start()
        return self.hosts[name]

    def _next_index(self) -> int:
        return NetnsFleet._count * 100 + len(self.hosts)

    @staticmethod
    def _free_slot() -> ipaddress.IPv4Network:
        used = set()
        for line in _run("ip", "-o", "-4", "addr", "show").stdout.splitlines():
            m = re.search(r"inet (\S+)", line)
            if m:
                net = ipaddress.ip_interface(m.group(1)).network
                if net.subnet_of(NETWORK):  # type: ignore[arg-type]
                    used.add(net.supernet(new_prefix=30) if net.prefixlen > 30 else net)
        for slot in NETWORK.subnets(new_prefix=30):
            if slot not in used:
                return slot
        raise RuntimeError(f"no /30 of {NETWORK} is free")

    def _write_client(self) -> None:
        self.ssh_config.write_text(
            "# hosts of a test fleet (tests/support/netns.py), removed with it\n"
            + "".join(h.client_config for h in self.hosts.values())
        )
        self.ssh_config.chmod(0o644)
        self.known_hosts.write_text("".join(h.known_hosts_line + "\n" for h in self.hosts.values() if h.host_public))

    def hosts_toml(self, *names: str, extra: dict[str, str] | None = None) -> str:
        """A hosts file naming these hosts by their ssh alias, and nothing else."""
        extra = extra or {}
        return "".join(f'[hosts.{n}]\ndestination = "{self.hosts[n].alias}"\n{extra.get(n, "")}\n' for n in names)

    def close(self) -> None:
        for host in self.hosts.values():
            host.destroy()
        self.hosts.clear()
        self.ssh_config.unlink(missing_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self in _live:
            _live.remove(self)


@atexit.register
def _close_all() -> None:
    for fleet in list(_live):
        with contextlib.suppress(Exception):
            fleet.close()


@pytest.fixture(scope="module")
def netns_fleet(tiny_model):
    require_netns()
    fleet = NetnsFleet(model_source=tiny_model)
    try:
        yield fleet
    finally:
        fleet.close()
