"""Build a small Llama-architecture model directory with random weights, offline.

The test suite and the default demo need a real model that a real vLLM engine can load without
a download. Random weights produce gibberish, but scheduling, batching, KV use, preemption and
latency are the engine's own, which is what the console measures. `tiny` keeps tests quick;
`small` is large enough that batching visibly changes throughput and latency on a CPU.

transformers, tokenizers and torch come from the vLLM environment; they are imported lazily so
the rest of the console works where they are absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


# Head dims must be ones the CPU attention backend supports (32, 48, 64, 80, 96, 112, 128, ...).
@dataclass(frozen=True)
class ModelSize:
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(2, 128, 4, 2, 256, 512, 2048),
    "small": ModelSize(8, 512, 8, 4, 1408, 2048, 4096),
}

# Text the tokenizer is trained on: varied enough to give a vocabulary of real merges.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the engine serves requests.",
    "Throughput rises with batch size until the key value cache runs out of blocks.",
    "Latency percentiles matter more than averages when an operator holds a target.",
    "Paged attention stores keys and values in fixed size blocks addressed by a table.",
    "A controller moves the admission window to keep tail latency under the limit.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" # $ % & @ ^ _ ` | ~",
]


def _train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 50, trainer=trainer)
    # transformers' constructors carry no annotations.
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


# A plain chat template, so /v1/chat/completions (the call most OpenAI clients make) works on the
# demo engine as it does on a real chat model; without one vLLM answers it 400.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Bumped when what a model directory holds changes, so directories built before are built again.
FORMAT = 2


def build_model(size: str, out_dir: Path, seed: int = 0) -> Path:
    """Write config.json, model.safetensors and a tokenizer to `out_dir`; return it.

    Idempotent: a directory that already holds a model of the same size is left as it is, so
    `make` can call this on every run.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    out_dir = Path(out_dir)
    marker = out_dir / "llmconsole-model.json"
    if marker.exists():
        built = json.loads(marker.read_text())
        if built.get("size") == size and built.get("format") == FORMAT:
            return out_dir

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SIZES[size]
    torch.manual_seed(seed)
    tokenizer = _train_tokenizer(s.vocab_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        head_dim=s.head_dim,
        max_position_embeddings=s.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # transformers: no annotations
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # its `to` wrapper is typed for modules
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    marker.write_text(json.dumps({"size": size, "seed": seed, "format": FORMAT}) + "\n")
    return out_dir
