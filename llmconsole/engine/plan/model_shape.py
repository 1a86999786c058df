"""A model's shape, read from its config.json: what sizes its weights and its KV cache.

The planner needs a handful of numbers (layers, hidden size, heads, KV heads, head_dim, vocab,
intermediate size, tied embeddings, dtype) and nothing else from the model, so it reads them
from the config file alone: no transformers import, no weights, milliseconds. Multimodal configs
keep the language model's numbers under `text_config`; that is the part that owns the KV cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per element of the dtypes vLLM runs weights and KV caches in.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


class ModelShapeError(ValueError):
    """The config cannot be read, or lacks a number the arithmetic needs."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tied_embeddings: bool
    config_dtype: str  # as the config names it, e.g. "bfloat16"
    # vLLM's default max_model_len: the smallest length limit the config names (before any rope
    # scaling, which only raises it: so a check against it never refuses what vLLM would run).
    default_max_model_len: int | None
    attention_bias: bool = False
    mlp_bias: bool = False
    num_experts: int = 1  # MoE: every expert's weights are resident
    num_experts_per_token: int = 1

    # --- weights ----------------------------------------------------------------------------

    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_attention_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * self.hidden_size
        bias = (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        return q + kv + o + bias

    @property
    def mlp_params_per_expert(self) -> int:
        # Gated MLP (gate, up, down), as in Llama, Qwen, Mistral and their descendants.
        bias = (2 * self.intermediate_size + self.hidden_size) if self.mlp_bias else 0
        return 3 * self.hidden_size * self.intermediate_size + bias

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def param_count(self) -> int:
        """Every resident parameter: embeddings, attention, all experts' MLPs, norms."""
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        per_layer = (
            self.attention_params_per_layer
            + self.num_experts * self.mlp_params_per_expert
            + router
            + 2 * self.hidden_size
        )
        return self.embedding_params + self.num_layers * per_layer + self.hidden_size

    @property
    def active_params_per_token(self) -> int:
        """Parameters each token multiplies through (the FLOPs side: MoE uses only its top-k)."""
        per_layer = self.attention_params_per_layer + self.num_experts_per_token * self.mlp_params_per_expert
        lm_head = self.vocab_size * self.hidden_size
        return self.num_layers * per_layer + lm_head

    def weight_bytes(self, dtype: str = "auto") -> int:
        return self.param_count * self.dtype_bytes(dtype)

    def dtype_bytes(self, dtype: str = "auto") -> int:
        """Bytes per weight element vLLM will use for `dtype` ("auto": the config's own, with
        float32 checkpoints run in 16 bits, as vLLM's auto dtype does)."""
        if dtype == "auto":
            return 2 if DTYPE_BYTES.get(self.config_dtype, 2) >= 2 else DTYPE_BYTES[self.config_dtype]
        try:
            return DTYPE_BYTES[dtype]
        except KeyError:
            raise ModelShapeError(f"unknown dtype {dtype!r}") from None

    # --- KV cache ---------------------------------------------------------------------------

    def kv_heads_per_rank(self, tensor_parallel_size: int = 1) -> int:
        """KV heads each tensor-parallel rank holds; vLLM replicates them when TP exceeds them."""
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tensor_parallel_size: int = 1) -> int:
        """2 (K and V) x layers x KV heads x head_dim x dtype bytes, for one TP rank."""
        return 2 * self.num_layers * self.kv_heads_per_rank(tensor_parallel_size) * self.head_dim * kv_dtype_bytes

    def kv_dtype_bytes(self, kv_cache_dtype: str = "auto", dtype: str = "auto") -> int:
        return self.dtype_bytes(dtype) if kv_cache_dtype == "auto" else DTYPE_BYTES[kv_cache_dtype]

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["param_count"] = self.param_count
        return d


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


# The keys vLLM reads a model's length limit from; it takes the smallest present, except that
# Cohere's model_max_length wins outright (vllm/transformers_utils/model_arch_config_convertor.py).
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def _default_max_model_len(c: dict[str, Any]) -> int | None:
    cohere = c.get("model_max_length")
    if isinstance(cohere, int):
        return cohere
    present = [c[k] for k in _MAX_LEN_KEYS if isinstance(c.get(k), int)]
    return min(present) if present else None


def shape_from_config(cfg: dict[str, Any]) -> ModelShape:
    """The shape from a parsed config.json (or its `text_config`, for multimodal models)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    c = {**cfg, **text} if text else cfg
    layers = _first(c, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _first(c, "hidden_size", "n_embd", "d_model")
    heads = _first(c, "num_attention_heads", "n_head")
    missing = [
        n
        for n, v in (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_attention_heads", heads))
        if v is None
    ]
    if missing:
        raise ModelShapeError(f"config.json lacks {', '.join(missing)}")
    kv_heads = _first(c, "num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
    head_dim = _first(c, "head_dim") or hidden // heads
    experts = _first(c, "num_local_experts", "num_experts", "n_routed_experts") or 1
    intermediate = _first(c, "moe_intermediate_size") if experts > 1 else None
    intermediate = intermediate or _first(c, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
    tied = c.get("tie_word_embeddings")
    return ModelShape(
        architecture=(cfg.get("architectures") or [cfg.get("model_type", "unknown")])[0],
        num_layers=int(layers),
        hidden_size=int(hidden),
        num_attention_heads=int(heads),
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab_size=int(_first(c, "vocab_size") or 0),
        intermediate_size=int(intermediate),
        tied_embeddings=bool(tied) if tied is not None else False,
        config_dtype=str(_first(c, "dtype", "torch_dtype") or "bfloat16").removeprefix("torch."),
        default_max_model_len=_default_max_model_len(c),
        attention_bias=bool(c.get("attention_bias") or c.get("qkv_bias") or False),
        mlp_bias=bool(c.get("mlp_bias") or False),
        num_experts=int(experts),
        num_experts_per_token=int(_first(c, "num_experts_per_tok", "moe_top_k") or 1),
    )


def read_shape(model_dir: str | Path) -> ModelShape:
    path = Path(model_dir).expanduser() / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelShapeError(f"{path} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ModelShapeError(f"{path} is unreadable: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelShapeError(f"{path} is not a JSON object")
    return shape_from_config(cfg)


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def local_config_dir(model: str) -> Path | None:
    """The directory holding `model`'s config.json: the model directory itself, or for a hub name
    the snapshot Hugging Face's cache holds (the one vLLM would load); None when neither exists."""
    p = Path(model).expanduser()
    if (p / "config.json").is_file():
        return p
    if model.count("/") != 1 or model.startswith(("/", ".", "~")):
        return None
    repo = _hub_cache() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        return snap if (snap / "config.json").is_file() else None
    snaps = sorted(
        (d for d in (repo / "snapshots").glob("*") if (d / "config.json").is_file()), key=lambda d: d.stat().st_mtime
    )
    return snaps[-1] if snaps else None
