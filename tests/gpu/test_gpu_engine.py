"""tests/integration/test_kernel_engine.py on a GPU host: two real CUDA engines on the tiny model, one with
vLLM's attention and one with llmconsole's kernel (`--kernel custom`, the CUDA backend), given the
same prompts greedily. The custom engine must report the kernel (status and its own counters),
run its decode rows in it, split mixed steps, and decode what the stock engine decodes.

Needs an NVIDIA GPU, the CUDA build of vLLM and nvcc (`make test-gpu`); not yet run anywhere.
"""

from __future__ import annotations

import time

import pytest

from llmconsole.kernels.usage import LOG_PREFIX
from tests.support.daemon import daemon_home
from tests.support.kernel_engine import (
    LONG_TOKENS,
    MAX_TOKENS,
    MIXED_PROMPTS,
    NUM_LAYERS,
    PROMPTS,
    compare,
    complete,
    settled_usage,
    staggered,
    usage_when_settled,
)

pytestmark = [pytest.mark.engine, pytest.mark.gpu, pytest.mark.needs_cuda_vllm]

# Both engines share the GPU: each asks vLLM for a third of it, and a fixed KV size.
ENGINE_FLAGS = [
    "--served-model-name",
    "tiny",
    "--max-num-seqs",
    "16",
    "--max-model-len",
    "512",
    "--kv-cache-memory-bytes",
    "50000000",
    "--gpu-memory-utilization",
    "0.3",
    "--enforce-eager",
    "--seed",
    "1234",
]


@pytest.fixture(scope="module")
def engines(tiny_model):
    from llmconsole.kernels.cuda_build import find_nvcc

    if find_nvcc() is None:
        pytest.skip("needs nvcc: a custom CUDA engine builds the kernel's library on its first start")
    with daemon_home("llmc-gpu-") as cli:
        for name in ("stock", "custom"):
            cli("engine", "start", name, "--model", str(tiny_model), "--kernel", name, *ENGINE_FLAGS, timeout=900)
        yield cli


@pytest.fixture(scope="module")
def completions(engines):
    return complete(engines.engine("custom")["url"]), complete(engines.engine("stock")["url"])


def test_status_reports_the_kernel_each_gpu_engine_runs(engines, completions):
    stock, custom = engines.engine("stock"), engines.engine("custom")
    assert stock["device"] == custom["device"] == "cuda"
    assert (stock["kernel"], stock["kernel_note"]) == ("stock", None)
    assert (custom["kernel"], custom["kernel_note"]) == ("custom", None), custom
    assert custom["custom_kernel_refusal"] is None


def test_same_greedy_tokens_and_close_logprobs_on_the_gpu(completions):
    ours, theirs = completions
    same, worst, _ = compare(ours, theirs, MAX_TOKENS)
    print(f"identical greedy outputs: {same}/{len(PROMPTS)}; max |logprob diff|: {worst:.4f}")
    assert same >= 0.7 * len(PROMPTS) and worst < 0.02


def test_decode_rows_ran_in_the_kernel_and_mixed_steps_split(engines, completions):
    custom, stock = engines.engine("custom"), engines.engine("stock")
    want = NUM_LAYERS * len(PROMPTS) * (MAX_TOKENS - 2)
    usage = usage_when_settled(custom["log_path"], want)
    assert usage is not None and usage.decode_tokens >= want, usage
    assert set(usage.fallback_calls) <= {"prefill"}, usage.fallback_calls
    assert LOG_PREFIX not in open(stock["log_path"], errors="replace").read()

    before = settled_usage(custom["log_path"])
    long_ours, batch_ours = staggered(custom["url"])
    long_theirs, batch_theirs = staggered(stock["url"])
    deadline = time.monotonic() + 30
    while True:
        since = settled_usage(custom["log_path"]).minus(before)
        if since.split_calls > 0:
            break
        assert time.monotonic() < deadline, f"no split steps counted: {since}"
    _, worst_long, n_long = compare([long_ours], [long_theirs], LONG_TOKENS)
    _, worst_batch, n_batch = compare(batch_ours, batch_theirs, MAX_TOKENS)
    assert max(worst_long, worst_batch) < 0.02 and n_long + n_batch >= 2 * MAX_TOKENS
    assert len(MIXED_PROMPTS) == len(batch_ours)
