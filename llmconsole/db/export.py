"""A session export: everything the store knows about a span of time, for a colleague.

The bundle is a directory: one JSONL file per table, and one of the tunes the tuner's study
journal holds for the span (tune_export.py) (for machines), CSV of metric samples and
sweep points (for spreadsheets), the engines' logs clipped to the span, SVG charts and a
Markdown report that ties them together (for people). With `session_id` the span is that
operator session's, and everything that happened on the host meanwhile is in it, automatic
actions included, because that is what a colleague needs to understand what the operator saw.

The bundle is the user's alone: its folder must be theirs and writable by nobody else (a folder
someone else owns or may write to is refused before anything is written), every file is created
new at 0600 and never through a symbolic link (llmconsole/export_folder.py), so nobody can read
the bundle or redirect a file of it elsewhere.

Nothing secret leaves: values under secret-named keys (api_key, *token*, *secret*, password)
and every string given in `secrets` are redacted everywhere, and the finished bundle is
searched for those strings once more before the call returns.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmconsole.db import report
from llmconsole.db.charts import Series, line_chart
from llmconsole.db.export_snapshot import ExportSnapshot, Span
from llmconsole.db.logclip import clip_file
from llmconsole.db.records import MetricSample, SweepPoint
from llmconsole.db.schema import BOUND_FIELDS, METRIC_FIELDS, PERCENTILE_FIELDS, SWEEP_FIGURES, bound_fields
from llmconsole.db.scrub import scrub, scrub_text
from llmconsole.db.store import Store
from llmconsole.db.tune_export import read_tunes, with_applied
from llmconsole.export_folder import ExportError, create_file, make_folder, prepare_out_dir


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    span: Span
    files: tuple[str, ...]  # paths relative to out_dir
    counts: tuple[tuple[str, int], ...]  # (table, records written)


def collect(
    store: Store, *, session_id: int | None = None, since_s: float | None = None, until_s: float | None = None
) -> ExportSnapshot:
    """The records in the span: the session's span when `session_id` is given."""
    if session_id is not None:
        s = store.session(session_id)
        if s is None:
            raise ExportError(f"there is no session {session_id} in {store.path}")
        since_s = s.attached_at if since_s is None else max(since_s, s.attached_at)
        until_s = s.detached_at if until_s is None else until_s
    until = time.time() if until_s is None else until_s
    since = since_s

    def started_by_end(t: float | None) -> bool:
        return t is None or t <= until

    sessions = tuple(s for s in store.sessions(since=since) if started_by_end(s.attached_at))
    runs = tuple(r for r in store.runs(since=since) if started_by_end(r.started_at))
    actions = tuple(store.actions(since=since, until=until))
    alerts = tuple(store.alerts(since=since, until=until))
    samples = tuple(store.metric_samples(since_s=since, until_s=until))
    window = tuple(store.window_trace(since_s=since, until_s=until))
    sweeps = tuple(s for s in store.sweeps(since=since) if started_by_end(s.created_at))
    points = tuple(p for s in sweeps for p in store.sweep_points(s.id))

    wanted: list[str] = []
    for cid in (
        [r.config_id for r in runs]
        + [a.from_config_id for a in actions]
        + [a.to_config_id for a in actions]
        + [s.config_id for s in sweeps]
        + [p.config_id for p in points]
    ):
        if cid and cid not in wanted:
            wanted.append(cid)
    configs = tuple(c for c in (store.config(cid) for cid in wanted) if c is not None)
    return ExportSnapshot(
        Span(since, until), session_id, sessions, configs, runs, actions, alerts, samples, window, sweeps, points
    )


def export_bundle(
    store: Store,
    out_dir: str | Path,
    session_id: int | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
    logs: Mapping[str, Path] | None = None,
    secrets: Iterable[str] = (),
    tunes_journal: Path | None = None,
) -> ExportResult:
    """Write the bundle for the span into `out_dir` (created; it must be empty if it exists).

    `logs` maps a name (usually the engine's) to a log file to clip into the bundle; `secrets`
    are strings that must not appear in it (API keys the caller knows of); `tunes_journal` is
    the tuner's study journal, whose tunes in the span are exported beside the store's records.
    """
    out = prepare_out_dir(Path(out_dir))
    known = [s for s in secrets if s]
    snap = collect(store, session_id=session_id, since_s=since_s, until_s=until_s)
    written: list[str] = []
    counts: list[tuple[str, int]] = []

    def clean(value: Any) -> Any:
        return scrub(value, known)

    tables = {
        "sessions": snap.sessions,
        "config_versions": snap.configs,
        "engine_runs": snap.runs,
        "actions": snap.actions,
        "alerts": snap.alerts,
        "metric_samples": snap.samples,
        "window_trace": snap.window,
        "sweeps": snap.sweeps,
        "sweep_points": snap.points,
    }
    for name, records in tables.items():
        path = out / f"{name}.jsonl"
        with create_file(path) as f:
            for r in records:
                f.write(json.dumps(clean(_jsonable(r)), sort_keys=True) + "\n")
        written.append(path.name)
        counts.append((name, len(records)))

    tunes = _tunes(snap, tunes_journal)
    written.append(_write_tunes(out / "tunes.jsonl", tunes, clean))
    counts.append(("tunes", len(tunes)))

    written.append(_write_samples_csv(out / "metric_samples.csv", snap.samples, clean))
    written.append(_write_points_csv(out / "sweep_points.csv", snap.points, clean))

    log_notes: dict[str, str] = {}
    if logs:
        make_folder(out / "logs")
        for name, src in logs.items():
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            rel = f"logs/{safe}.log"
            if not Path(src).is_file():
                log_notes[name] = f"not found: {src}"
                continue
            with create_file(out / rel) as dst:
                n = clip_file(
                    Path(src), dst, snap.span.since_s, snap.span.until_s, lambda line: scrub_text(line, known)
                )
            log_notes[name] = f"[{rel}]({rel}), {n} lines"
            written.append(rel)

    plots = _write_plots(out, snap)
    written.extend(plots)
    report_text = report.render(snap, plots=plots, logs=log_notes, files=written + ["report.md"], tunes=tunes)
    with create_file(out / "report.md") as f:
        f.write(scrub_text(report_text, known))
    written.append("report.md")

    _verify_clean(out, written, known)
    return ExportResult(out, snap.span, tuple(written), tuple(counts))


def _jsonable(record: Any) -> dict[str, Any]:
    """A record as a JSON object: `detail_json` text becomes a `detail` object, tuples lists."""
    d = dataclasses.asdict(record)
    for key in [k for k in d if k.endswith("_json")]:
        d[key.removesuffix("_json")] = json.loads(d.pop(key))
    return d


def _utc(t: float | None) -> str:
    return "" if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _tunes(snap: ExportSnapshot, journal: Path | None) -> list[dict[str, Any]]:
    """The span's tunes, each with whether its recommendation was applied."""
    if journal is None:
        return []
    return with_applied(read_tunes(journal, snap.span.since_s, snap.span.until_s), snap.actions)


def _write_tunes(path: Path, tunes: Iterable[dict[str, Any]], clean: Callable[[Any], Any]) -> str:
    with create_file(path) as f:
        for t in tunes:
            f.write(json.dumps(clean(t), sort_keys=True) + "\n")
    return path.name


def _samples_csv_columns() -> list[str]:
    """The gauges in column order, each percentile followed by its bucket's bounds."""
    columns: list[str] = []
    for f in METRIC_FIELDS:
        if f in BOUND_FIELDS:
            continue
        columns.append(f)
        if f in PERCENTILE_FIELDS:
            columns.extend(bound_fields(f))
    return columns


def _samples_csv_cell(s: MetricSample, column: str) -> Any:
    """A sample's value as a CSV cell: empty for missing. An upper bound past the last finite one
    reads `inf` (a spreadsheet and pandas read it as infinity; empty would read as missing)."""
    value = getattr(s, column)
    if value is None and column.endswith("_upper_s") and getattr(s, column.replace("_upper_s", "_lower_s")) is not None:
        return "inf"
    return "" if value is None else value


def _write_samples_csv(path: Path, samples: Iterable[MetricSample], clean: Callable[[Any], Any]) -> str:
    columns = _samples_csv_columns()
    with create_file(path) as f:
        w = csv.writer(f)
        w.writerow(["engine", "at_s", "at_utc", "resolution_s", *columns])
        for s in samples:
            w.writerow(
                [clean(s.engine), s.at_s, _utc(s.at_s), s.resolution_s, *(_samples_csv_cell(s, c) for c in columns)]
            )
    return path.name


def _write_points_csv(path: Path, points: Iterable[SweepPoint], clean: Callable[[Any], Any]) -> str:
    points = list(points)
    param_keys: list[str] = []
    for p in points:
        for k in p.params:
            if k not in param_keys:
                param_keys.append(k)
    with create_file(path) as f:
        w = csv.writer(f)
        w.writerow(
            [
                "sweep_id",
                "point_id",
                "at_utc",
                "repeat",
                "config_id",
                *(f"param:{k}" for k in param_keys),
                *SWEEP_FIGURES,
                "status",
                "flags",
            ]
        )
        for p in points:
            params = clean(p.params)
            w.writerow(
                [
                    p.sweep_id,
                    p.id,
                    _utc(p.at),
                    p.repeat,
                    p.config_id or "",
                    *(_cell(params.get(k)) for k in param_keys),
                    *("" if getattr(p, f) is None else getattr(p, f) for f in SWEEP_FIGURES),
                    p.status,
                    ";".join(clean(list(p.flags))),
                ]
            )
    return path.name


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    return json.dumps(v) if isinstance(v, (dict, list)) else v


def _write_plots(out: Path, snap: ExportSnapshot) -> list[str]:
    make_folder(out / "plots")
    engines = sorted({s.engine for s in snap.samples})

    def series(field: str, label: str = "") -> list[Series]:
        return [(f"{e}{label}", [(s.at_s, getattr(s, field)) for s in snap.samples if s.engine == e]) for e in engines]

    charts = {
        "throughput.svg": ("Generation throughput", series("generation_tok_s"), "tokens/s"),
        "prompt_throughput.svg": ("Prompt throughput", series("prompt_tok_s"), "tokens/s"),
        "p99_latency.svg": (
            "p99 latency: the top of the histogram bucket it fell in",
            [s for e in engines for field, name in P99_PLOTTED for s in p99_series(snap.samples, e, field, name)],
            "seconds (p99 at most)",
        ),
        "kv_cache_usage.svg": ("KV cache usage", series("kv_cache_usage"), "fraction of KV cache"),
    }
    groups = sorted({w.group_name for w in snap.window})
    charts["window.svg"] = (
        "Batch window",
        [(g, [(w.at_s, w.window) for w in snap.window if w.group_name == g]) for g in groups],
        "requests admitted at once",
    )
    written = []
    for name, (title, data, y_label) in charts.items():
        with create_file(out / "plots" / name) as f:
            f.write(line_chart(title, data, y_label))
        written.append(f"plots/{name}")
    return written


# The p99s the latency plot draws, and their names in its legend.
P99_PLOTTED = (("p99_ttft_s", "TTFT"), ("p99_e2e_s", "E2E"))


def p99_series(samples: Iterable[MetricSample], engine: str, field: str, name: str) -> list[Series]:
    """One engine's p99 as a plot may draw it: the top of the histogram bucket it fell in (the
    p99 was at most that; a figure inside the bucket would claim what the data cannot tell).
    Past the last finite bound there is no top: those samples are a series of their own at the
    bound they exceeded. Samples recorded before bounds were kept plot their interpolated figure,
    named so. The last two appear only where such samples exist."""
    top: list[tuple[float, float | None]] = []
    past: list[tuple[float, float | None]] = []
    bare: list[tuple[float, float | None]] = []
    for s in samples:
        if s.engine != engine:
            continue
        p = s.percentile(field)
        known = p is not None and s.bounds_recorded(field)
        open_ended = p is not None and known and p.upper_bound_s is None
        top.append((s.at_s, p.upper_bound_s if p is not None and known else None))
        past.append((s.at_s, p.lower_s if p is not None and open_ended else None))
        bare.append((s.at_s, p.value_s if p is not None and not known else None))
    out: list[Series] = [(f"{engine} {name} at most", top)]
    if any(v is not None for _, v in past):
        out.append((f"{engine} {name} more than", past))
    if any(v is not None for _, v in bare):
        out.append((f"{engine} {name} no bucket", bare))
    return out


def _verify_clean(out: Path, files: Iterable[str], known: list[str]) -> None:
    """Last line of defence: a bundle with a known secret in it is removed, not handed over."""
    if not known:
        return
    leaked = []
    for rel in files:
        data = (out / rel).read_bytes()
        if any(s.encode() in data for s in known):
            leaked.append(rel)
    for rel in leaked:
        os.unlink(out / rel)
    if leaked:
        raise ExportError(f"a secret survived scrubbing in {', '.join(leaked)}; those files were removed")
