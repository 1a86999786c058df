"""The daemon's Prometheus endpoint: `llmconsole_*` series on 127.0.0.1, read at scrape time.

A custom collector reads the daemon's live state (the fleet's statuses, the gateway's groups, the
alert tracker) when Prometheus scrapes, so there is no second set of counters to keep in step.
The port is the metrics_port setting (LLMCONSOLE_METRICS_PORT, config.toml, a flag) when set, else
the one used last time (exporter.json in the data directory), else a free one, which is then
remembered: a scrape config keeps working across daemon restarts. The address is 127.0.0.1 unless
the metrics_bind setting names another (a private interface a fleet's Prometheus reaches): never
beyond loopback unless asked.
A set or saved port that another process holds stops the daemon at start, and the Host header
must name loopback (a browser page cannot read it by DNS rebinding).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, StateSetMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from llmconsole.atomic import write_atomic
from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.services.gateway_service import move_port, port_taken
from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.gateway.door import DoorLimits, allowed_hosts, host_allowed
from llmconsole.engine.gateway.group import OUTCOMES
from llmconsole.engine.modes.memory import FRACTIONS
from llmconsole.engine.modes.policy import used_fraction
from llmconsole.engine.ports import pick_port
from llmconsole.engine.status import EngineState
from llmconsole.settings import Resolved
from llmconsole.settings import load as load_settings

if TYPE_CHECKING:
    from llmconsole.daemon.services.mode_service import ModeService
    from llmconsole.daemon.services.response_service import ResponseService

log = logging.getLogger(__name__)

PORT_ENV = "LLMCONSOLE_METRICS_PORT"
_STATES = [str(s) for s in EngineState]
_MODES = [m.value for m in FRACTIONS]


class DaemonCollector:
    def __init__(self, ctx: DaemonContext, responses: ResponseService | None = None, modes: ModeService | None = None):
        self.fleet = ctx.fleet
        self.gateway = ctx.gateway
        self.responses = responses
        self.modes = modes

    def collect(self) -> Iterator[Metric]:
        statuses = self.fleet.statuses()
        e = ["engine"]
        state = StateSetMetricFamily("llmconsole_engine_state", "The engine's supervision state", labels=e)
        restarts = CounterMetricFamily("llmconsole_engine_restarts", "Restarts after crashes", labels=e)
        looping = GaugeMetricFamily(
            "llmconsole_engine_crash_looping", "1 while the engine's config is crash-looping", labels=e
        )
        config = InfoMetricFamily("llmconsole_engine_config", "The engine's config version", labels=e)
        mode = StateSetMetricFamily("llmconsole_engine_mode", "The engine's memory mode", labels=e)
        mode_auto = GaugeMetricFamily("llmconsole_engine_mode_auto", "1 when the auto policy picks the mode", labels=e)
        seqs = GaugeMetricFamily("llmconsole_engine_max_num_seqs", "The engine's max_num_seqs", labels=e)
        kv_tokens = GaugeMetricFamily(
            "llmconsole_engine_kv_cache_tokens", "KV cache size in tokens at start-up", labels=e
        )
        kv_usage = GaugeMetricFamily("llmconsole_engine_kv_cache_usage_ratio", "KV cache in use, 0..1", labels=e)
        for st in statuses:
            state.add_metric([st.name], {s: s == str(st.state) for s in _STATES})
            restarts.add_metric([st.name], st.restarts)
            looping.add_metric([st.name], 1.0 if st.crash_looping else 0.0)
            config.add_metric(
                [st.name],
                {
                    "config_id": st.config_id,
                    "model": st.served_model_name,
                    "kernel": st.spec.get("kernel", "stock"),
                    "kv_cache_dtype": str(st.spec.get("kv_cache_dtype", "auto")),
                },
            )
            current = getattr(st, "mode", None)
            mode.add_metric([st.name], {m: m == current for m in _MODES})
            mode_auto.add_metric([st.name], 1.0 if getattr(st, "mode_auto", False) else 0.0)
            if st.spec.get("max_num_seqs") is not None:
                seqs.add_metric([st.name], st.spec["max_num_seqs"])
            if st.kv_cache_tokens is not None:
                kv_tokens.add_metric([st.name], st.kv_cache_tokens)
            usage = getattr(st.metrics, "kv_cache_usage", None)
            if usage is not None:
                kv_usage.add_metric([st.name], usage)
        yield from (state, restarts, looping, config, mode, mode_auto, seqs, kv_tokens, kv_usage)
        yield from self._host()
        yield from self._gateway()
        yield from self._alerts()

    def _host(self) -> Iterator[Metric]:
        host = self.fleet.probe.sample_host()
        mem = GaugeMetricFamily("llmconsole_host_memory_used_ratio", "Host memory in use, 0..1")
        if host.memory_used_bytes is not None and host.memory_total_bytes:
            mem.add_metric([], host.memory_used_bytes / host.memory_total_bytes)
        gpu = GaugeMetricFamily("llmconsole_gpu_memory_used_ratio", "GPU memory in use, 0..1", labels=["gpu"])
        for g in host.gpus:
            if g.memory_used_bytes is not None and g.memory_total_bytes:
                gpu.add_metric([str(g.index)], g.memory_used_bytes / g.memory_total_bytes)
        yield mem
        yield gpu
        pressure = GaugeMetricFamily(
            "llmconsole_memory_pressure_ratio", "What the auto mode policy reads: the fullest GPU, else host memory"
        )
        frac = used_fraction(host)
        if frac is not None:
            pressure.add_metric([], frac)
        yield pressure

    def _gateway(self) -> Iterator[Metric]:
        if self.gateway is None:
            return
        e = ["engine"]
        g = {
            name: GaugeMetricFamily(f"llmconsole_{name}", doc, labels=e)
            for name, doc in (
                ("gateway_window", "Requests the group admits at once"),
                ("gateway_in_flight", "Requests in flight through the gateway"),
                ("gateway_queued", "Requests waiting in the group's queue"),
                ("gateway_held", "1 while the group's queue is held for a restart"),
                ("controller_target_seconds", "The window controller's latency target"),
                ("controller_measured_seconds", "The latency the controller measured at its last step"),
                ("controller_error", "Relative error at the last step: (target - measured) / target"),
                ("controller_p", "Proportional term at the last step"),
                ("controller_i", "Integral term at the last step"),
                ("controller_d", "Derivative term at the last step"),
                ("controller_frozen", "1 while the controller is frozen"),
                ("slo_attainment_ratio", f"Requests within the latency target over the last {ar.SLO_WINDOW_S:.0f} s"),
                ("slo_objective_ratio", "The latency SLO's objective"),
                ("slo_burn_rate", "How fast the SLO's error budget burns (1 = exactly on budget)"),
            )
        }
        admitted = CounterMetricFamily("llmconsole_gateway_admitted", "Requests admitted", labels=e)
        rejected = CounterMetricFamily(
            "llmconsole_gateway_rejected",
            "Requests and connections turned away, by reason; the door's own "
            "(before a request reaches a group) have an empty engine label",
            labels=["engine", "reason"],
        )
        requests = CounterMetricFamily(
            "llmconsole_gateway_requests", "Requests finished, by how they ended", labels=["engine", "outcome"]
        )
        door = self.gateway.gateway.door
        for reason, count in sorted(door.rejected.items()):
            rejected.add_metric(["", reason], count)
        connections = GaugeMetricFamily("llmconsole_gateway_connections", "Client connections open at the gateway")
        connections.add_metric([], door.open_connections)
        cap = GaugeMetricFamily("llmconsole_gateway_connection_limit", "Client connections the gateway keeps at most")
        cap.add_metric([], door.cap)
        for name, group in list(self.gateway.gateway.groups.items()):
            st = group.admission.stats()
            c = group.controller
            g["gateway_window"].add_metric([name], st.window)
            g["gateway_in_flight"].add_metric([name], st.in_flight)
            g["gateway_queued"].add_metric([name], st.queued)
            g["gateway_held"].add_metric([name], 1.0 if getattr(group, "held", False) else 0.0)
            g["controller_target_seconds"].add_metric([name], c.settings.target_ms / 1000.0)
            g["controller_frozen"].add_metric([name], 1.0 if c.frozen else 0.0)
            last = c.trace[-1] if c.trace else None
            if last is not None:
                if last.measured_ms is not None:
                    g["controller_measured_seconds"].add_metric([name], last.measured_ms / 1000.0)
                if last.error is not None:
                    g["controller_error"].add_metric([name], last.error)
                for term in ("p", "i", "d"):
                    g[f"controller_{term}"].add_metric([name], getattr(last, term))
            slo = ar.slo_figures(list(group.records), c.settings.target_ms, str(c.settings.signal))
            g["slo_objective_ratio"].add_metric([name], slo.objective)
            attainment, burn = slo.attainment, slo.burn_rate  # both None, or both known
            if attainment is not None and burn is not None:
                g["slo_attainment_ratio"].add_metric([name], attainment)
                g["slo_burn_rate"].add_metric([name], burn)
            admitted.add_metric([name], st.admitted_total)
            rejected.add_metric([name, "queue_full"], st.rejected_full_total)
            rejected.add_metric([name, "queue_timeout"], st.timed_out_total)
            for outcome in OUTCOMES:
                requests.add_metric([name, outcome], group.outcomes.get(outcome, 0))
        yield from g.values()
        yield admitted
        yield rejected
        yield requests
        yield connections
        yield cap

    def _alerts(self) -> Iterator[Metric]:
        if self.responses is None:
            return
        alert = GaugeMetricFamily(
            "llmconsole_alert_state", "The daemon's own alerts: 1 pending, 2 firing", labels=["rule", "engine"]
        )
        for a in self.responses.tracker.active.values():
            alert.add_metric([a.rule, a.engine], 2.0 if a.state == "firing" else 1.0)
        yield alert


class Exporter:
    def __init__(
        self,
        collector: DaemonCollector,
        data_dir: Path,
        host: str | None = None,
        port: int | None = None,
        settings: Resolved | None = None,
    ):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.settings = settings if settings is not None else load_settings()
        self.host = host or self.settings.settings.metrics_bind
        self._file = data_dir / "exporter.json"
        set_port = self.settings.settings.metrics_port
        self.port = port if port is not None else set_port if set_port is not None else self._saved_port()
        self._runner: web.AppRunner | None = None
        self._hosts = allowed_hosts(self.host, DoorLimits())
        self.refused_hosts = 0

    def _saved_port(self) -> int:
        try:
            return int(json.loads(self._file.read_text()).get("port") or 0)
        except (OSError, ValueError, AttributeError):
            return 0

    async def _metrics(self, request: web.Request) -> web.Response:
        if not host_allowed(request.headers.get("Host"), self._hosts):
            self.refused_hosts += 1
            return web.Response(status=403, text="the Host header does not name this exporter\n")
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            # Port 0: one below the ephemeral range, kept across restarts (engine/ports.py).
            site = web.TCPSite(self._runner, self.host, self.port or pick_port(self.host))
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            if self.port == 0:
                raise
            how = (
                move_port(self.settings, "metrics_port")
                if self.settings.settings.metrics_port is not None
                else f"remove {self._file} (a free port is then chosen and saved) or set {PORT_ENV}"
            )
            raise port_taken("metrics", self.host, self.port, e, how) from None
        self.port = int(self._runner.addresses[0][1])  # the port bound, when 0 asked for a free one
        write_atomic(self._file, json.dumps({"port": self.port}))
        log.info("Prometheus metrics on %s", self.url)
        return self.url

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "port": self.port}
