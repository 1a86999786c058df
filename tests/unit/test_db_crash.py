"""A recorder killed with SIGKILL mid-write loses nothing it had reported and leaves a sound file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from llmconsole.db import Store

# Two threads, as in the daemon: one floods samples in big batches, the other logs actions and
# says so on stdout only after record_action has returned (the commit is done).
_CHILD = textwrap.dedent("""
    import sys, threading
    from llmconsole.db import MetricSample, Store

    store = Store.open(sys.argv[1])
    out = threading.Lock()

    def flood():
        t = 0
        while True:
            store.add_metric_samples(
                [MetricSample(f"e{k % 4}", float(t + k), running=k, kv_cache_usage=0.5,
                              p99_ttft_s=0.1, gpu_memory_bytes=2**34) for k in range(20_000)])
            t += 20_000
            with out:
                print("batch", t, flush=True)

    threading.Thread(target=flood, daemon=True).start()
    n = 0
    while True:
        action_id = store.record_action("mode", engine="e0", detail={"n": n, "pad": "x" * 500})
        n += 1
        with out:
            print("action", action_id, flush=True)
""")


def test_sigkill_mid_write_keeps_every_reported_action(tmp_path):
    path = tmp_path / "llmconsole.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    reported: list[int] = []
    batches = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            kind, value = line.split()
            if kind == "action":
                reported.append(int(value))
            else:
                batches += 1
            # Kill while both writers are busy: a batch transaction is almost always in flight.
            if batches >= 3 and len(reported) >= 50:
                break
        os.kill(proc.pid, signal.SIGKILL)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Lines already written to the pipe before the kill were printed after their commit too.
    reported += [int(line.split()[1]) for line in rest.splitlines() if line.startswith("action ")]
    assert proc.returncode == -signal.SIGKILL, err
    assert batches >= 3 and len(reported) >= 50, (batches, len(reported), err)

    with Store.open(path) as store:
        assert store.integrity_check() == "ok"
        stored = {a.id for a in store.actions()}
        missing = sorted(set(reported) - stored)
        assert missing == [], f"{len(missing)} reported actions were lost: {missing[:10]}"
        assert len(store.metric_samples("e0")) >= 3 * 20_000 // 4
