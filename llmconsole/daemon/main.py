"""The per-host daemon: one per LLMCONSOLE_HOME (a lock), detached, outliving every console.

Run as `python -m llmconsole.daemon.main`; `llmconsole daemon start` does that in a new
session with its output in the daemon log. SIGTERM stops the daemon and leaves the engines
serving (a new daemon adopts them); `daemon stop --stop-engines` stops them first.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import gc
import logging
import os
import signal
import sys
import time

from aiohttp import web

from llmconsole.daemon.api import make_app
from llmconsole.daemon.api.engines import STOP, STOP_ENGINES
from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.fault_points import pause_hook
from llmconsole.daemon.hosted import HostedServices
from llmconsole.daemon.http import this_user_only
from llmconsole.daemon.services.gateway_service import GatewayService, PortTaken
from llmconsole.daemon.services.rollback import close_interrupted, on_change_ended, on_config_failed
from llmconsole.db import Store, StoreError
from llmconsole.db.recorder import Recorder
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.gateway.door import raise_descriptor_limit
from llmconsole.paths import Paths, UnsafeDirectory, resolve
from llmconsole.settings import Resolved
from llmconsole.settings import load as load_settings
from llmconsole.settings.flags import add_set_flag

log = logging.getLogger("llmconsole.daemon")

EXIT_CONFIG = 2
EXIT_ALREADY_RUNNING = 3
EXIT_STORE = 4
EXIT_PORT_TAKEN = 5


class AlreadyRunning(RuntimeError):
    pass


def acquire_lock(paths: Paths) -> int:
    """Hold an exclusive lock for the daemon's lifetime; the kernel drops it if we die."""
    fd = os.open(paths.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            pid = paths.daemon_pid_file.read_text().strip()
        except OSError:
            pid = "?"
        raise AlreadyRunning(f"a daemon is already running for {paths.data_dir} (pid {pid})") from None
    os.set_inheritable(fd, False)
    return fd


def _write_pid_file(paths: Paths) -> None:
    fd = os.open(paths.daemon_pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def freeze_startup_heap() -> int:
    """Move every object alive now (modules, classes, the services just built) out of the
    collector's reach; returns how many. A full collection walks every tracked object, and on the
    event loop it is a stall for every first token the gateway relays: the daemon's startup heap
    alone (about 100,000 objects) cost 25-30 ms a pass, and under a flood of connections full
    passes of 100-170 ms were measured. What is made after this is collected as before."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def serve(paths: Paths, resolved: Resolved) -> None:
    settings = resolved.settings
    fleet = Fleet(
        paths,
        settings.supervision_policy(),
        pause_at=pause_hook(paths.data_dir),
        cpu_kv_budget_bytes=settings.cpu_kv_budget_bytes,
        engine_env=dict(os.environ),  # engines inherit the daemon's environment, less llmconsole's own
    )
    # The store opens first: a database that is damaged or not ours stops the daemon with the
    # store's message (and the file untouched) before any engine is adopted or started.
    store = Store.open(paths.database)
    recorder = Recorder(store, stable_after_s=fleet.policy.stable_after_s)
    fleet.status_listeners.append(recorder.observe)
    fleet.change_listeners.append(on_change_ended(store))
    for line in await fleet.open():
        log.info("resumed %s", line)
    recorder.close_orphans(fleet.statuses())
    for line in close_interrupted(store, fleet.found):
        log.warning("%s", line)
    for st in fleet.statuses():
        recorder.observe(st)
    gateway = GatewayService(fleet, store=store, settings=resolved)  # the engines' front door and window loop
    await gateway.start()
    ctx = DaemonContext(fleet=fleet, store=store, gateway=gateway, recorder=recorder, settings=resolved)
    fleet.config_failed_listeners.append(on_config_failed(ctx))
    services = HostedServices.build(ctx)  # modes, alerts, /metrics, tunes, console-started runs
    await services.start()
    app = make_app(ctx, services)
    app.middlewares.insert(0, this_user_only)  # before anything reads a request: whose is it?
    sampler = asyncio.create_task(_sample_forever(fleet, recorder), name="recorder")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if paths.socket.exists() or paths.socket.is_symlink():
        paths.socket.unlink()  # a stale socket of a dead daemon; the lock proves it is dead
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
    try:
        site = web.UnixSite(runner, str(paths.socket))
        await site.start()
    finally:
        os.umask(old_umask)
    os.chmod(paths.socket, 0o600)
    frozen = freeze_startup_heap()
    log.info("daemon %d listening on %s (%d startup objects frozen)", os.getpid(), paths.socket, frozen)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app[STOP].set)
    loop.add_signal_handler(signal.SIGHUP, lambda: None)  # losing a terminal changes nothing

    await app[STOP].wait()
    requested: list[bool] = app[STOP_ENGINES]
    stop_engines = any(requested)
    log.info("daemon stopping (%s)", "stopping engines" if stop_engines else "engines keep serving")
    sampler.cancel()
    await services.close()
    await gateway.close()
    await fleet.close(stop_engines=stop_engines)
    await runner.cleanup()
    store.close()
    try:
        paths.socket.unlink()
    except FileNotFoundError:
        pass


async def _sample_forever(
    fleet: Fleet, recorder: Recorder, interval_s: float = 1.0, compact_every_s: float = 300.0
) -> None:
    """1 Hz metric samples of every serving engine, written off the event loop; compaction
    (the retention policy) every few minutes."""
    last_compact = time.monotonic()
    while True:
        began = time.monotonic()
        try:
            await asyncio.to_thread(recorder.sample, fleet.statuses())
            if began - last_compact > compact_every_s:
                last_compact = began
                await asyncio.to_thread(recorder.store.compact)
        except asyncio.CancelledError:
            raise
        except Exception:  # a full disk must not stop supervision; say so and go on
            log.exception("recording metric samples failed")
        await asyncio.sleep(max(0.05, interval_s - (time.monotonic() - began)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m llmconsole.daemon.main", description="llmconsole's per-host daemon")
    add_set_flag(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # Every setting is read and checked before anything is created or started: a bad one
        # (the file:line, variable or flag that gave it is named) stops the daemon here.
        resolved = load_settings(args.set)
        paths = resolve().ensure()
        pause_hook(paths.data_dir)  # a test's fault-injection point that names no phase: say so here
    except (UnsafeDirectory, ValueError) as e:  # SettingsError is a ValueError
        print(f"llmconsole daemon: {e}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(
        level=resolved.settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        lock_fd = acquire_lock(paths)
    except AlreadyRunning as e:
        print(f"llmconsole daemon: {e}", file=sys.stderr)
        return EXIT_ALREADY_RUNNING
    _write_pid_file(paths)
    # Every client connection takes a descriptor: take all the kernel allows this process (the
    # gateway then caps its connections below that, with a reserve for supervision).
    before, after = raise_descriptor_limit()
    log.info("descriptor limit %d (was %d)", after, before)
    try:
        asyncio.run(serve(paths, resolved))
    except StoreError as e:
        print(f"llmconsole daemon: {e}", file=sys.stderr)
        return EXIT_STORE
    except PortTaken as e:
        print(f"llmconsole daemon: {e}", file=sys.stderr)
        return EXIT_PORT_TAKEN
    finally:
        try:
            paths.daemon_pid_file.unlink()
        except FileNotFoundError:
            pass
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
