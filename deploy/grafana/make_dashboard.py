"""Writes llmconsole-fleet.json, the Grafana dashboard of a fleet of llmconsole hosts.

    python deploy/grafana/make_dashboard.py        # after changing a panel here

The dashboard follows the conventions of vLLM's production-stack dashboards: a Prometheus
datasource chosen by a template variable, collapsible rows by concern, stat panels for the
overview and time series per instance, rates over $__rate_interval and quantiles from histogram
buckets. Its variables pick hosts (the `host` label that `llmconsole hosts prometheus-targets`
puts on every target), engines (`engine` on llmconsole_* series, `llmconsole_engine` on vLLM's)
and gateway groups (`engine` on the gateway's series, which names the group). A test checks that
the JSON is this script's output and that it only queries series that exist.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("llmconsole-fleet.json")
DS = {"type": "prometheus", "uid": "${datasource}"}

# Label matchers of the three selections, for each family of series.
ENGINE = 'host=~"$host", engine=~"$engine"'  # llmconsole_engine_* (per engine)
GROUP = 'host=~"$host", engine=~"$group"'  # llmconsole_gateway_*, controller_*, slo_* (per group)
HOST = 'host=~"$host"'  # llmconsole_host_*, gpu_* (per host)
VLLM = 'host=~"$host", llmconsole_engine=~"$engine"'  # vllm:* (each engine's own /metrics)


class Layout:
    """Panels placed left to right on a 24-column grid, a row header starting a new line."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._id(),
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            }
        )
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "range": not instant,
    }
    if instant:
        t["instant"] = True
    return t


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    max_value: float | None = None,
    stack: bool = False,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if stack else "none"},
        },
    }
    if max_value is not None:
        defaults["min"], defaults["max"] = 0, max_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    description: str,
    expr: str,
    unit: str = "short",
    thresholds: list[tuple[float | None, str]] | None = None,
) -> dict[str, Any]:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, ref="A", instant=True)],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {
            "colorMode": "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "textMode": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    }


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
    }


def dashboard() -> dict[str, Any]:
    p = Layout()

    p.row("Fleet")
    p.add(
        stat(
            "Hosts answering",
            "Daemons whose exporter Prometheus scraped at its last try",
            f'count(up{{job="llmconsole", {HOST}}} == 1) or vector(0)',
        ),
        4,
        4,
    )
    p.add(
        stat(
            "Hosts down",
            "Daemons Prometheus could not scrape (host, tunnel or exporter down)",
            f'count(up{{job="llmconsole", {HOST}}} == 0) or vector(0)',
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
        4,
    )
    p.add(
        stat(
            "Engines ready",
            "Engines whose /health answers, across the selected hosts",
            f'count(llmconsole_engine_state{{{ENGINE}, llmconsole_engine_state="ready"}} == 1) or vector(0)',
        ),
        4,
        4,
    )
    p.add(
        stat(
            "Engines not ready",
            "Engines starting, unhealthy, crashed or failed",
            f'count(llmconsole_engine_state{{{ENGINE}, llmconsole_engine_state=~"starting|unhealthy|crashed|failed"}}'
            f" == 1) or vector(0)",
            thresholds=[(None, "green"), (1, "orange")],
        ),
        4,
        4,
    )
    p.add(
        stat(
            "Restarts (1 h)",
            "Restarts after crashes over the last hour",
            f"sum(increase(llmconsole_engine_restarts_total{{{ENGINE}}}[1h])) or vector(0)",
            thresholds=[(None, "green"), (1, "orange"), (3, "red")],
        ),
        4,
        4,
    )
    p.add(
        stat(
            "Alerts firing",
            "The daemons' own alerts in the firing state",
            f"count(llmconsole_alert_state{{{HOST}}} == 2) or vector(0)",
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
        4,
    )

    p.row("KV cache")
    p.add(
        timeseries(
            "KV cache usage (daemon)",
            "The KV cache in use of each engine, as its daemon reads it",
            [target(f"llmconsole_engine_kv_cache_usage_ratio{{{ENGINE}}}", "{{host}} / {{engine}}")],
            unit="percentunit",
            max_value=1,
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "KV cache usage (vLLM)",
            "vLLM's own gauge (gpu_cache_usage_perc in older releases)",
            [
                target(
                    f"max by (host, llmconsole_engine) (vllm:kv_cache_usage_perc{{{VLLM}}} "
                    f"or vllm:gpu_cache_usage_perc{{{VLLM}}})",
                    "{{host}} / {{llmconsole_engine}}",
                )
            ],
            unit="percentunit",
            max_value=1,
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Device memory",
            "The fullest GPU of each host, and host memory",
            [
                target(f"max by (host) (llmconsole_gpu_memory_used_ratio{{{HOST}}})", "{{host}} GPU"),
                target(f"llmconsole_host_memory_used_ratio{{{HOST}}}", "{{host}} host", ref="B"),
            ],
            unit="percentunit",
            max_value=1,
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Preemptions",
            "Requests vLLM preempted for lack of KV blocks",
            [
                target(
                    f"sum by (host, llmconsole_engine) (rate(vllm:num_preemptions_total{{{VLLM}}}[$__rate_interval]))",
                    "{{host}} / {{llmconsole_engine}}",
                )
            ],
            unit="ops",
        ),
        12,
        7,
    )
    p.add(
        timeseries(
            "KV cache size",
            "Tokens of KV cache each engine started with",
            [target(f"llmconsole_engine_kv_cache_tokens{{{ENGINE}}}", "{{host}} / {{engine}}")],
        ),
        12,
        7,
    )

    p.row("Queue and throughput")
    p.add(
        timeseries(
            "Requests running (vLLM)",
            "Requests in the engine's batch",
            [target(f"vllm:num_requests_running{{{VLLM}}}", "{{host}} / {{llmconsole_engine}}")],
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Requests waiting (vLLM)",
            "Requests in the engine's own queue",
            [target(f"vllm:num_requests_waiting{{{VLLM}}}", "{{host}} / {{llmconsole_engine}}")],
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Gateway queue",
            "Requests held at each group's gateway, and in flight through it",
            [
                target(f"llmconsole_gateway_queued{{{GROUP}}}", "{{host}} / {{engine}} queued"),
                target(f"llmconsole_gateway_in_flight{{{GROUP}}}", "{{host}} / {{engine}} in flight", ref="B"),
            ],
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Generation throughput",
            "Output tokens per second",
            [
                target(
                    f"sum by (host, llmconsole_engine) "
                    f"(rate(vllm:generation_tokens_total{{{VLLM}}}[$__rate_interval]))",
                    "{{host}} / {{llmconsole_engine}}",
                )
            ],
            unit="tps",
            stack=True,
        ),
        12,
        7,
    )
    p.add(
        timeseries(
            "Gateway admissions and rejections",
            "Requests admitted, and turned away (queue full or timed out)",
            [
                target(
                    f"sum by (host, engine) (rate(llmconsole_gateway_admitted_total{{{GROUP}}}[$__rate_interval]))",
                    "{{host}} / {{engine}} admitted",
                ),
                target(
                    f"sum by (host, engine, reason) (rate(llmconsole_gateway_rejected_total{{{GROUP}}}"
                    f"[$__rate_interval]))",
                    "{{host}} / {{engine}} {{reason}}",
                    ref="B",
                ),
            ],
            unit="reqps",
        ),
        12,
        7,
    )

    p.row("Batch window")
    p.add(
        timeseries(
            "Window",
            "Requests each group admits at once, as its PID controller sets it",
            [target(f"llmconsole_gateway_window{{{GROUP}}}", "{{host}} / {{engine}}")],
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Latency vs target",
            "The latency the controller measured at its last step, and its target",
            [
                target(f"llmconsole_controller_measured_seconds{{{GROUP}}}", "{{host}} / {{engine}} measured"),
                target(f"llmconsole_controller_target_seconds{{{GROUP}}}", "{{host}} / {{engine}} target", ref="B"),
            ],
            unit="s",
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Controller error",
            "(target - measured) / target at each step; frozen controllers hold",
            [
                target(f"llmconsole_controller_error{{{GROUP}}}", "{{host}} / {{engine}}"),
                target(f"llmconsole_controller_frozen{{{GROUP}}}", "{{host}} / {{engine}} frozen", ref="B"),
            ],
            unit="percentunit",
        ),
        8,
        8,
    )

    p.row("SLO")
    p.add(
        timeseries(
            "SLO attainment",
            "Requests within the latency target over the daemon's window, and the objective",
            [
                target(f"llmconsole_slo_attainment_ratio{{{GROUP}}}", "{{host}} / {{engine}}"),
                target(f"llmconsole_slo_objective_ratio{{{GROUP}}}", "{{host}} / {{engine}} objective", ref="B"),
            ],
            unit="percentunit",
            max_value=1,
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Error budget burn rate",
            "1 = spending the budget exactly; the shipped rule fires above 10",
            [target(f"llmconsole_slo_burn_rate{{{GROUP}}}", "{{host}} / {{engine}}")],
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "Time to first token p99 (vLLM)",
            "From the engines' own histograms",
            [
                target(
                    f"histogram_quantile(0.99, sum by (le, host, llmconsole_engine) "
                    f"(rate(vllm:time_to_first_token_seconds_bucket{{{VLLM}}}[$__rate_interval])))",
                    "{{host}} / {{llmconsole_engine}} p99",
                ),
                target(
                    f"histogram_quantile(0.5, sum by (le, host, llmconsole_engine) "
                    f"(rate(vllm:time_to_first_token_seconds_bucket{{{VLLM}}}[$__rate_interval])))",
                    "{{host}} / {{llmconsole_engine}} p50",
                    ref="B",
                ),
            ],
            unit="s",
        ),
        8,
        8,
    )
    p.add(
        timeseries(
            "End-to-end latency p99 (vLLM)",
            "From the engines' own histograms",
            [
                target(
                    f"histogram_quantile(0.99, sum by (le, host, llmconsole_engine) "
                    f"(rate(vllm:e2e_request_latency_seconds_bucket{{{VLLM}}}[$__rate_interval])))",
                    "{{host}} / {{llmconsole_engine}} p99",
                )
            ],
            unit="s",
        ),
        12,
        7,
    )
    p.add(
        timeseries(
            "Time per output token p99 (vLLM)",
            "From the engines' own histograms",
            [
                target(
                    f"histogram_quantile(0.99, sum by (le, host, llmconsole_engine) "
                    f"(rate(vllm:request_time_per_output_token_seconds_bucket{{{VLLM}}}"
                    f"[$__rate_interval])))",
                    "{{host}} / {{llmconsole_engine}} p99",
                )
            ],
            unit="s",
        ),
        12,
        7,
    )

    p.row("Restarts and health")
    p.add(
        timeseries(
            "Restarts",
            "Restarts after crashes, per engine (10 minute increase)",
            [target(f"increase(llmconsole_engine_restarts_total{{{ENGINE}}}[10m])", "{{host}} / {{engine}}")],
        ),
        8,
        7,
    )
    p.add(
        timeseries(
            "Crash looping",
            "1 while an engine's config crash-loops (the daemon then rolls it back)",
            [target(f"llmconsole_engine_crash_looping{{{ENGINE}}}", "{{host}} / {{engine}}")],
        ),
        8,
        7,
    )
    p.add(
        timeseries(
            "Daemon scrape up",
            "1 while Prometheus reaches the host's exporter",
            [target(f'up{{job="llmconsole", {HOST}}}', "{{host}}")],
        ),
        8,
        7,
    )

    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": "A fleet of llmconsole hosts: per host, per engine and per gateway group: KV cache, "
        "queues, the batch window against its target, SLO attainment and restarts.",
        "editable": True,
        "graphTooltip": 1,
        "links": [],
        "panels": p.panels,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["llmconsole", "vllm"],
        "templating": {
            "list": [
                {
                    "type": "datasource",
                    "name": "datasource",
                    "label": "Data source",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                },
                query_variable("host", "Host", "label_values(llmconsole_engine_state, host)"),
                query_variable("engine", "Engine", 'label_values(llmconsole_engine_state{host=~"$host"}, engine)'),
                query_variable("group", "Group", 'label_values(llmconsole_gateway_window{host=~"$host"}, engine)'),
            ]
        },
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": "llmconsole fleet",
        "uid": "llmconsole-fleet",
        "version": 1,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
