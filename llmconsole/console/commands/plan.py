"""`llmconsole plan`: will a config fit on a device, what will it do, what should it run with.

Needs no daemon and no engine: it reads the model's config.json and does the arithmetic.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmconsole.console.cli_common import EXIT_USAGE, CliError
from llmconsole.console.spec_flags import add_spec_flags, spec_overrides
from llmconsole.engine.host import HostProbe
from llmconsole.engine.plan.cost import CostInputs
from llmconsole.engine.plan.devices import device_names, profile, profile_for_gpu_name, with_price
from llmconsole.engine.plan.planner import Plan, make_plan
from llmconsole.engine.plan.recommend import parse_workload
from llmconsole.engine.plan.topology import load_topology, read_topology
from llmconsole.engine.spec import EngineSpec, validation_messages


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="will a config fit on a device, what will it do, what should it run with",
        description="Exact KV arithmetic from the model's config.json, roofline estimates, cost, and "
        "recommendations for a workload. Engine flags are vLLM's own names.",
    )
    p.add_argument(
        "--device",
        default="auto",
        type=str.strip,
        help=f"one of {', '.join(device_names())}; auto (the default): this host's first GPU "
        "as NVML names it, else cpu",
    )
    p.add_argument("--tp", type=int, default=None, metavar="N", help="tensor-parallel size (--tensor-parallel-size)")
    p.add_argument(
        "--workload",
        default=None,
        metavar="SPEC",
        help="prompt=TOKENS,output=TOKENS,goal=real-time|throughput,p99=S,qps=N (any subset)",
    )
    p.add_argument(
        "--topology", default=None, metavar="FILE", help="a recorded NVML topology (JSON) instead of this host's"
    )
    p.add_argument("--price-usd", type=float, default=None, help="price of one device (overrides the profile)")
    p.add_argument("--power-w", type=float, default=None, help="rated power of one device")
    p.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a cost setting, e.g. electricity_usd_per_kwh=0.2 (repeatable)",
    )
    p.add_argument("--measure-bandwidth", action="store_true", help="measure this host's memory bandwidth (cpu)")
    p.add_argument("--json", action="store_true")
    add_spec_flags(p)
    p.set_defaults(func=cmd_plan)


def _cost_inputs(items: list[str]) -> CostInputs:
    values: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise CliError(f"--cost {item!r}: expected KEY=NUMBER", EXIT_USAGE) from None
        if not sep:
            raise CliError(f"--cost {item!r}: expected KEY=NUMBER", EXIT_USAGE)
    try:
        return CostInputs.defaults(**values)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _device_name(given: str) -> str:
    if given != "auto":
        return given
    gpus = HostProbe().sample_gpus()
    if not gpus:
        return "cpu"
    name = profile_for_gpu_name(gpus[0].name or "")
    if name is None:
        raise CliError(f"no profile for this host's GPU ({gpus[0].name}); pass --device", EXIT_USAGE)
    return name


def build_plan(ns: argparse.Namespace) -> Plan:
    if not hasattr(ns, "model"):
        raise CliError("plan needs --model DIR|NAME", EXIT_USAGE)
    try:
        fields: dict[str, Any] = spec_overrides(ns)
        if ns.tp is not None:
            fields["tensor_parallel_size"] = ns.tp
        spec = EngineSpec(**fields)
        device = with_price(profile(_device_name(ns.device), ns.measure_bandwidth), ns.price_usd, ns.power_w)
        workload = parse_workload(ns.workload)
        topology = (
            load_topology(Path(ns.topology)) if ns.topology else (read_topology() if device.kind == "cuda" else None)
        )
    except ValidationError as e:
        raise CliError("invalid engine spec:\n  " + "\n  ".join(validation_messages(e)), EXIT_USAGE) from None
    except (ValueError, OSError, KeyError) as e:
        raise CliError(str(e), EXIT_USAGE) from None
    return make_plan(spec, device, workload, topology=topology, cost_inputs=_cost_inputs(ns.cost))


def _b(n: int | float | None) -> str:
    if n is None:
        return "N/A"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n:,.0f} B ({n / size:.2f} {unit})"
    return f"{n:,.0f} B"


def format_plan(plan: Plan) -> str:
    d, s, out = plan.device, plan.shape, []
    out.append(f"plan: {Path(plan.model).name} on {d.name}, tensor-parallel {plan.tensor_parallel_size}")
    w = plan.workload
    out.append(
        f"workload: prompt {w.prompt_tokens}, output {w.output_tokens}, goal {w.goal or 'none'}, "
        f"p99 target {w.p99_target_s or 'none'}, qps {w.qps if w.qps is not None else 'none'}"
    )
    if s is not None:
        out.append("")
        out.append("exact (config.json and vLLM's rules)")
        out.append(
            f"  model           {s.architecture}: {s.num_layers} layers, hidden {s.hidden_size}, "
            f"{s.num_attention_heads} heads, {s.num_kv_heads} KV heads, head_dim {s.head_dim}"
        )
        out.append(f"  parameters      {s.param_count:,}; weights per rank {_b(plan.weight_bytes_per_rank)}")
        out.append(
            f"  KV per token    {_b(plan.kv_bytes_per_token)} per rank; block {plan.block_size} tokens = "
            f"{_b(plan.bytes_per_block)}"
        )
        c = plan.capacity
        if c is not None:
            label = "exact" if plan.kv_exact else "estimate"
            out.append(
                f"  KV capacity     {c.num_blocks:,} blocks = {c.tokens:,} tokens; {c.max_concurrency:.2f} "
                f"requests of {c.max_model_len:,} tokens [{label}]"
            )
        v = plan.verdict
        if v is not None:
            out.append(f"  fit             {'OK' if v.ok else 'DOES NOT FIT'}: {v.reason}")
            out.extend(f"                  {line}" for line in v.details() if not line.startswith("start anyway"))
        out.append("")
        out.append("estimates (roofline; efficiencies fitted to Vidur's A100-80GB Llama-2-7B profile)")
        out.append(f"  device          {d.source}")
        if plan.budget is not None:
            bd = plan.budget
            out.append(
                f"  memory          {_b(bd.total_bytes)} x {bd.utilization} - weights {_b(bd.weight_bytes)} - "
                f"activations {_b(bd.activation_bytes)} - runtime {_b(bd.runtime_reserve_bytes)} = "
                f"KV {_b(max(0, bd.kv_bytes))}"
            )
        out.append("  batch   TTFT ms    ITL ms    e2e s   out tok/s     req/s")
        for p in plan.curve:
            out.append(
                f"  {p.batch:>5} {p.ttft_s * 1e3:>9.2f} {p.itl_s * 1e3:>9.2f} {p.e2e_s:>8.2f} "
                f"{p.output_tok_s:>11,.0f} {p.requests_s:>9.2f}"
            )
        if plan.cost is not None:
            k = plan.cost
            per_m = f"${k.usd_per_million_tokens:.4f}" if k.usd_per_million_tokens is not None else "N/A"
            out.append(
                f"  cost            {k.replicas} replica(s) x {k.num_gpus} device(s): hardware "
                f"${k.hardware_usd:,.0f}, {k.years:g}-year TCO ${k.tco_usd:,.0f}; {per_m} per million "
                f"tokens at {k.target_qps:.2f} req/s"
            )
    out.append("")
    out.append("recommendations")
    for r in plan.recommendations:
        out.append(f"  {r.setting} = {r.value}    rule: {r.rule}" + (f" ({r.detail})" if r.detail else ""))
    if plan.findings:
        out.append("")
        out.append("warnings")
        for f in plan.findings:
            out.append(f"  ! {f.check}: {f.problem}")
            out.append(f"    fix: {f.fix}")
    if plan.notes:
        out.append("")
        out.extend(f"note: {n}" for n in plan.notes)
    return "\n".join(out)


def cmd_plan(ns: argparse.Namespace) -> int:
    plan = build_plan(ns)
    print(json.dumps(plan.to_json(), indent=2) if ns.json else format_plan(plan))
    return 0
