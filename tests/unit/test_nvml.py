"""NVML is initialised once per process, lazily and thread-safely, and a failure (this host has no
GPU: nvmlInit fails) is remembered rather than retried on every gauge read or plan."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types

import pytest

from llmconsole.engine import nvml
from llmconsole.engine.host import HostProbe
from llmconsole.engine.plan import topology, validate


class CountingInit:
    def __init__(self, fail: Exception | None = None, delay_s: float = 0.0):
        self.calls = 0
        self.fail = fail
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)  # a slow driver: every thread arrives while the first is inside
        if self.fail is not None:
            raise self.fail


def _module(init: CountingInit, count: int = 0):
    return types.SimpleNamespace(
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 << 30, used=1 << 30),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=5, memory=1),
        nvmlDeviceGetPowerUsage=lambda h: 70_000,
        nvmlDeviceGetTemperature=lambda h, sensor: 40,
        nvmlDeviceGetP2PStatus=lambda a, b, cap: 0,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 30,
    )


def _use_everywhere(nv: nvml.Nvml, rounds: int = 5) -> None:
    """Every caller of NVML, several times over: the probe's gauges, the planner's GPU memory and
    topology."""
    probe = HostProbe(nv)
    for _ in range(rounds):
        probe.sample_host()
        probe.sample_gpus()
        validate._gpu_total_bytes()
        topology.read_topology()


def test_a_failing_init_is_tried_once_and_remembered(monkeypatch):
    init = CountingInit(fail=RuntimeError("NVML Shared Library Not Found"))
    nv = nvml.Nvml(_module(init))
    monkeypatch.setattr(nvml, "NVML", nv)
    _use_everywhere(nv)
    assert init.calls == 1
    assert not nv.ready() and nv.error == "RuntimeError: NVML Shared Library Not Found"
    assert HostProbe(nv).sample_host().nvml_error == nv.error


def test_a_working_init_happens_once_for_every_caller(monkeypatch):
    init = CountingInit()
    nv = nvml.Nvml(_module(init, count=2))
    monkeypatch.setattr(nvml, "NVML", nv)
    _use_everywhere(nv)
    assert init.calls == 1 and nv.error is None
    assert [g.name for g in HostProbe(nv).sample_gpus()] == ["NVIDIA H100 80GB HBM3"] * 2
    assert validate._gpu_total_bytes() == 80 << 30
    assert topology.read_topology().gpu_names == ("NVIDIA H100 80GB HBM3",) * 2


def test_threads_racing_to_the_first_use_init_once():
    init = CountingInit(delay_s=0.2)
    nv = nvml.Nvml(_module(init))
    start = threading.Barrier(8)
    answers: list[bool] = []

    def first_use() -> None:
        start.wait()
        answers.append(nv.ready())

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert init.calls == 1 and answers == [True] * 8


def test_no_library_is_a_reason_not_an_error():
    nv = nvml.Nvml(None)
    assert not nv.ready() and nv.error == "nvidia-ml-py is not importable"
    assert nv.call("nvmlDeviceGetCount") is None


def test_the_real_library_on_this_host_is_initialised_at_most_once(monkeypatch):
    """nvidia-ml-py itself. Where there is no GPU (as on the machines the suite runs on) its
    nvmlInit fails, and the failure is remembered: one call, however often the gauges are read."""
    pynvml = pytest.importorskip("pynvml")
    init = CountingInit()
    real_init = pynvml.nvmlInit

    def counted() -> None:
        init()
        real_init()

    monkeypatch.setattr(pynvml, "nvmlInit", counted)
    nv = nvml.Nvml(pynvml)
    monkeypatch.setattr(nvml, "NVML", nv)
    _use_everywhere(nv)
    assert init.calls == 1
    assert nv.ready() == (nv.error is None)  # either it works, or it said why, once


def test_commands_import_pynvml_only_when_they_read_a_gpu():
    code = "import sys, llmconsole.console.cli; print('pynvml' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
