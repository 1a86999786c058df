"""The export's Markdown report: what ran, what changed and why, what fired, what sweeps found."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmconsole.db.records import Action, MetricSample
from llmconsole.db.tune_export import tune_lines
from llmconsole.engine.metrics.percentile import worst

if TYPE_CHECKING:
    from llmconsole.db.export_snapshot import ExportSnapshot


def _utc(t: float | None) -> str:
    return "—" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _num(v: float | int | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, int) or float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.{digits}g}"


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):  # an empty mapping adds no fields: {} and absent read the same
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, before, after) for every field that differs, nested fields as `env.NAME`."""
    a, b = _flatten(before), _flatten(after)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _shown(diff: list[tuple[str, Any, Any]]) -> str:
    shown = "; ".join(f"`{k}`: {json.dumps(x)} → {json.dumps(y)}" for k, x, y in diff[:8])
    return shown + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")


def _change(action: Action, specs: Mapping[str, dict[str, Any]]) -> str:
    """What an action changed: the config fields between its two configs, or, for a change that
    is no config (a window, a group, a setting), the values it recorded `from` and `to`."""
    src, dst = action.from_config_id, action.to_config_id
    if src and dst and src != dst and src in specs and dst in specs:
        return f"{src} → {dst}: {_shown(config_diff(specs[src], specs[dst])) or 'no field differs'}"
    before, after = action.detail.get("from"), action.detail.get("to")
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        return _shown(config_diff(before, after)) or "no value differs"
    if isinstance(before, Mapping):  # refused or failed: nothing changed
        return "from " + ", ".join(f"`{k}`: {json.dumps(v)}" for k, v in _flatten(before).items())
    if dst:
        return f"→ {dst}"
    return src or ""


_P99_COLUMNS = (("p99_ttft_s", "TTFT"), ("p99_itl_s", "ITL"), ("p99_tpot_s", "TPOT"), ("p99_e2e_s", "E2E"))


def _worst_p99(samples: Sequence[MetricSample], field: str) -> str:
    """The span's worst p99 of one engine as the histogram bucket it fell in (`< 300 ms`), never
    a figure inside it. Samples recorded before buckets were kept say so beside it, with their
    worst interpolated figure as it was shown then."""
    with_bounds = [p for s in samples if s.bounds_recorded(field) and (p := s.percentile(field)) is not None]
    without = [v for s in samples if not s.bounds_recorded(field) and (v := getattr(s, field)) is not None]
    top = worst(with_bounds)
    text = top.text() if top is not None else ""
    if without:
        n = len(without)
        old = f"{n} sample{'s' if n > 1 else ''} without bucket, worst {_seconds(max(without))} interpolated"
        text = f"{text} ({old})" if text else old
    return text or "—"


def _seconds(v: float) -> str:
    return f"{v:.3g} s" if v >= 1 else f"{v * 1000:.3g} ms"


def _p99_lines(samples: Sequence[MetricSample]) -> list[str]:
    engines = sorted({s.engine for s in samples if any(getattr(s, f) is not None for f, _ in _P99_COLUMNS)})
    if not engines:
        return []
    rows = [(e, *(_worst_p99([s for s in samples if s.engine == e], f) for f, _ in _P99_COLUMNS)) for e in engines]
    return [
        "Worst p99 in the span, as the vLLM histogram bucket it fell in (the buckets are all the data "
        "can tell apart; the p99 plot draws each bucket's top):",
        "",
        *_table(["engine", *(name for _, name in _P99_COLUMNS)], rows),
        "",
    ]


def first_record_s(snap: ExportSnapshot) -> float | None:
    """When the first record of the snapshot was made (None: it holds none)."""
    times = [
        *(s.attached_at for s in snap.sessions),
        *(c.first_seen_at for c in snap.configs),
        *(r.started_at for r in snap.runs),
        *(a.at for a in snap.actions),
        *(a.at for a in snap.alerts),
        *(m.at_s for m in snap.samples),
        *(w.at_s for w in snap.window),
        *(s.created_at for s in snap.sweeps),
    ]
    known = [t for t in times if t is not None]
    return min(known) if known else None


def render(
    snap: ExportSnapshot,
    *,
    plots: list[str],
    logs: Mapping[str, str],
    files: list[str],
    tunes: Sequence[dict[str, Any]] = (),
) -> str:
    span = snap.span
    # With no start asked for, the span starts at the first record: say when that was.
    since = span.since_s if span.since_s is not None else first_record_s(snap)
    title = f"session {snap.session_id}" if snap.session_id is not None else "span"
    lines = [f"# llmconsole export: {title}", ""]
    if since is None:
        lines.append(f"- Span (UTC): up to {_utc(span.until_s)}; nothing was recorded")
    else:
        first = " (the first record)" if span.since_s is None else ""
        lines.append(
            f"- Span (UTC): {_utc(since)}{first} → {_utc(span.until_s)} ({(span.until_s - since) / 3600:.1f} h)"
        )
    hosts = sorted({s.host for s in snap.sessions})
    users = sorted({s.user for s in snap.sessions})
    if hosts:
        lines.append(f"- Host: {', '.join(hosts)}; operators: {', '.join(users)}")
    lines.append(f"- Generated: {_utc(time.time())} UTC")
    lines.append(
        f"- Engines seen: {', '.join(sorted({r.engine for r in snap.runs} | {s.engine for s in snap.samples})) or 'none'}"
    )
    lines.append("")

    lines += ["## Sessions", ""]
    lines += (
        _table(
            ["id", "user", "host", "client", "attached", "detached"],
            [(s.id, s.user, s.host, s.client, _utc(s.attached_at), _utc(s.detached_at)) for s in snap.sessions],
        )
        if snap.sessions
        else ["None in this span."]
    )
    lines.append("")

    lines += ["## What ran", ""]
    if snap.runs:
        lines += _table(
            [
                "run",
                "engine",
                "config",
                "started",
                "ready after",
                "exited",
                "exit",
                "KV tokens",
                "max concurrency",
                "outcome",
            ],
            [
                (
                    r.id,
                    r.engine,
                    r.config_id,
                    _utc(r.started_at),
                    "—" if r.ready_at is None else f"{r.ready_at - r.started_at:.1f} s",
                    _utc(r.exited_at),
                    "—"
                    if r.exit_code is None and not r.exit_reason
                    else f"{_num(r.exit_code)} {r.exit_reason or ''}".strip(),
                    _num(r.kv_cache_tokens),
                    "—" if r.max_concurrency is None else f"{r.max_concurrency:.2f}x",
                    r.outcome,
                )
                for r in snap.runs
            ],
        )
    else:
        lines.append("No engine ran in this span.")
    lines.append("")

    specs = {c.config_id: c.spec for c in snap.configs}
    lines += ["## What changed", ""]
    if snap.actions:
        lines += _table(
            ["time", "actor", "engine", "action", "outcome", "change"],
            [
                (
                    _utc(a.at),
                    a.actor + (" (automatic)" if a.automatic and a.actor != "automatic" else ""),
                    a.engine or "—",
                    a.kind,
                    a.outcome,
                    _change(a, specs),
                )
                for a in snap.actions
            ],
        )
    else:
        lines.append("No actions in this span.")
    lines.append("")
    if tunes:  # a tune's trial restarts are no actions: its own record says what it did
        lines += ["### Tunes", "", *tune_lines(tunes), "", "Trials: [tunes.jsonl](tunes.jsonl).", ""]
    if snap.configs:
        lines += ["### Configs", ""]
        for c in snap.configs:
            label = f" ({c.label})" if c.label else ""
            lines += [
                f"**{c.config_id}**{label}, first seen {_utc(c.first_seen_at)}",
                "",
                "```json",
                json.dumps(c.spec, indent=2, sort_keys=True),
                "```",
                "",
            ]

    lines += ["## Alerts", ""]
    lines += (
        _table(
            ["fired", "resolved", "engine", "rule", "severity", "state"],
            [(_utc(a.at), _utc(a.resolved_at), a.engine or "—", a.rule, a.severity, a.state) for a in snap.alerts],
        )
        if snap.alerts
        else ["No alerts in this span."]
    )
    lines.append("")

    lines += ["## Sweeps", ""]
    if not snap.sweeps:
        lines += ["No sweeps in this span.", ""]
    for sw in snap.sweeps:
        lines += [
            f"### Sweep {sw.id}: {sw.engine}, {sw.status}",
            "",
            f"Created {_utc(sw.created_at)}, finished {_utc(sw.finished_at)}. "
            f"Grid `{json.dumps(sw.grid, sort_keys=True)}`, load `{json.dumps(sw.load, sort_keys=True)}`, "
            f"SLO `{json.dumps(sw.slo, sort_keys=True)}`.",
            "",
        ]
        pts = [p for p in snap.points if p.sweep_id == sw.id]
        lines += (
            _table(
                [
                    "params",
                    "repeat",
                    "req/s",
                    "tok/s",
                    "p50 TTFT s",
                    "p99 TTFT s",
                    "p99 ITL s",
                    "p99 E2E s",
                    "peak KV",
                    "preemptions",
                    "status",
                    "flags",
                ],
                [
                    (
                        json.dumps(p.params, sort_keys=True),
                        p.repeat,
                        _num(p.throughput_req_s),
                        _num(p.throughput_tok_s),
                        _num(p.p50_ttft_s),
                        _num(p.p99_ttft_s),
                        _num(p.p99_itl_s),
                        _num(p.p99_e2e_s),
                        _num(p.peak_kv_usage),
                        _num(p.preemptions),
                        p.status,
                        ", ".join(p.flags) or "—",
                    )
                    for p in pts
                ],
            )
            if pts
            else ["No points recorded."]
        )
        lines.append("")

    lines += ["## Over time", ""]
    lines += [f"![{p.removeprefix('plots/').removesuffix('.svg')}]({p})" for p in plots] + [""]
    lines += _p99_lines(snap.samples)
    coarse = sum(1 for s in snap.samples if s.resolution_s > 1.0)
    if coarse:
        lines += [
            f"{coarse} of {len(snap.samples)} samples are downsampled averages "
            "(p99 and KV usage: the interval's maximum, a p99 with the bounds of the bucket it fell in).",
            "",
        ]

    if logs:
        lines += ["## Logs", ""] + [f"- {name}: {note}" for name, note in sorted(logs.items())] + [""]
    lines += ["## Files", ""] + [f"- [{f}]({f})" for f in files] + [""]
    return "\n".join(lines)
