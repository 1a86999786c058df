"""One engine group behind the gateway: its engines, admission gate, controller and measurements.

A group is what a window applies to. By default each engine is its own group; a group with
several engines routes each request to the ready engine with the fewest outstanding requests,
and its window counts the whole group's requests in flight.

An engine about to go through a guarded restart (a mode switch, an applied tune) is held: it gets
no new requests, finishes those it has, and the group goes on serving through its other ready engines.
Only a group with no engine left to route to closes its gate, so that arrivals wait in its queue.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from llmconsole.engine.gateway.admission import Admission
from llmconsole.engine.gateway.measures import LatencySample, TraceSample
from llmconsole.engine.gateway.pid import PidController, PidSettings
from llmconsole.engine.gateway.upstream import UpstreamDown, UpstreamResponse

# An answer whose engine is marked down is cut when the engine has sent nothing on it for this
# long: a frozen engine's answers have been silent for as long as its health checks went
# unanswered (seconds), while one that goes down to be restarted may still stream the answers
# it is finishing.
SILENT_WHEN_DOWN_S = 1.0


@dataclass
class Upstream:
    """One engine of a group, as the gateway sees it. Mutable by design: the daemon updates
    `ready` and `url` as the engine restarts; `outstanding` counts requests sent to it."""

    name: str
    url: str  # http://127.0.0.1:PORT, no trailing slash
    api_key: str | None = None
    ready: bool = True
    outstanding: int = 0
    held: bool = False  # taken out of routing for a restart; set apart from `ready`,
    # which the daemon copies from the engine's state
    remote: bool = False  # an engine of another host (ENGINE@HOST): its key opens no door here
    requests: int = 0  # requests sent to it since it joined, for the group's per-engine counts
    resent: int = 0  # of those, the ones it refused or failed as it went away, sent again
    down_at: float | None = None  # when a request last found it refusing (monotonic s)
    # Its answers still open, for cutting them when it is marked down (see release).
    inflight: set[UpstreamResponse] = field(default_factory=set, repr=False, compare=False)

    @property
    def routable(self) -> bool:
        return self.ready and not self.held

    def release(self, reason: str, silent_s: float = SILENT_WHEN_DOWN_S) -> int:
        """Cut its open answers that have been silent for `silent_s`: their requests fail (or go
        to another engine, when nothing of them reached the client) and give their window seats
        back now, instead of waiting on an engine that is not answering. Returns how many."""
        now = time.monotonic()
        cut = [r for r in self.inflight if r.silent_s(now) >= silent_s]
        for r in cut:
            r.cut(UpstreamDown(f"engine {self.name} was marked down ({reason})"))
        return len(cut)


# How a request ended. Only an engine's own failures count against it (and its config) in the
# tune guard, the SLO figures and the automatic rollback: what clients do (leave, read too
# slowly, send bad requests) and how many of them come at once (a full queue) says nothing about
# the engine, and any local user could otherwise force a rollback by flooding the door.
OK = "ok"
ENGINE_ERROR = "engine_error"  # the engine answered 5xx, or could not be reached in time
UPSTREAM_DIED = "upstream_died"  # the engine's answer was cut off mid-way (it died)
CLIENT_ERROR = "client_error"  # the engine refused the request as invalid (4xx)
QUEUE_FULL = "queue_full"
QUEUE_TIMEOUT = "queue_timeout"
CLIENT_DISCONNECTED = "client_disconnected"
CLIENT_TIMEOUT = "client_timeout"  # the gateway cut a client that stopped reading
UNAUTHORIZED = "unauthorized"
ENGINE_FAULTS = frozenset({ENGINE_ERROR, UPSTREAM_DIED})
OUTCOMES = (
    OK,
    ENGINE_ERROR,
    UPSTREAM_DIED,
    CLIENT_ERROR,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    CLIENT_DISCONNECTED,
    CLIENT_TIMEOUT,
    UNAUTHORIZED,
)


@dataclass(frozen=True)
class RequestRecord:
    """One request as the gateway saw it. Client-visible times run from arrival at the gateway;
    `engine_*` times run from dispatch to the engine (what the window changes)."""

    group: str
    engine: str | None
    path: str
    status: int
    outcome: str  # one of OUTCOMES
    streamed: bool
    finished_at_s: float  # wall clock
    queue_s: float
    ttft_s: float | None  # arrival -> first streamed chunk
    e2e_s: float  # arrival -> last byte (or the failure)
    engine_ttft_s: float | None
    engine_e2e_s: float | None
    output_chunks: int = 0
    # The engine's own count from a stream's usage frame (clients that ask for one); events
    # undercount tokens when vLLM merges several into one event under load.
    output_tokens: int | None = None

    @property
    def engine_fault(self) -> bool:
        return self.outcome in ENGINE_FAULTS

    @property
    def judged(self) -> bool:
        """Whether this request says anything about the engine: it was served, or the engine
        failed it. Client-side ends and admission refusals do not."""
        return self.outcome == OK or self.outcome in ENGINE_FAULTS

    @property
    def output_len(self) -> int | None:
        """Tokens streamed: the usage frame's count, else one per event (a stream without a usage
        frame has only output events), as the controller's TPOT counts them."""
        if self.output_tokens is not None:
            return self.output_tokens
        return self.output_chunks if self.streamed and self.output_chunks > 0 else None


class EngineGroup:
    """The queue timeout defaults to 5 minutes because it is also how long a request waits for
    an engine that restarts (a mode switch, a sweep point, a rollback): minutes on a CPU host
    or a big model. A saturated group still answers at once: a full queue is a 503."""

    def __init__(
        self,
        name: str,
        upstreams: list[Upstream] | None = None,
        *,
        settings: PidSettings | None = None,
        controlled: bool = True,
        max_queue: int = 256,
        queue_timeout_s: float = 300.0,
        records_len: int = 2048,
    ) -> None:
        self.name = name
        self.upstreams: dict[str, Upstream] = {u.name: u for u in (upstreams or [])}
        self.controller = PidController(settings)
        self.controlled = controlled  # False: a static window (the controller never steps)
        self.admission = Admission(self.controller.window, max_queue, queue_timeout_s)
        self.records: collections.deque[RequestRecord] = collections.deque(maxlen=records_len)
        self.outcomes: collections.Counter[str] = collections.Counter()  # since start, for /metrics
        self.model_names: set[str] = set()
        self.refresh_open()

    # --- engines --------------------------------------------------------------------------

    def set_upstream(
        self, name: str, url: str | None, ready: bool, api_key: str | None = None, *, remote: bool = False
    ) -> None:
        up = self.upstreams.get(name)
        if up is None:
            up = self.upstreams[name] = Upstream(name, url or "", api_key, ready=False, remote=remote)
        if url:
            up.url = url.rstrip("/")
        up.api_key = api_key
        up.remote = remote
        was_ready = up.ready
        up.ready = bool(ready and up.url)
        if remote and was_ready and not up.ready:
            # Another host's engine that failed its health checks: nothing will come of the
            # requests it went silent on. (This host's engines are the supervisor's: one that
            # stops or restarts drains first, and one that hangs is killed, which ends them.)
            up.release("its health checks failed")
        self.refresh_open()

    def remove_upstream(self, name: str) -> None:
        self.upstreams.pop(name, None)
        self.refresh_open()

    def refresh_open(self) -> None:
        """Admit only while an engine can take requests; otherwise arrivals wait in the queue."""
        self.admission.set_open(any(u.routable for u in self.upstreams.values()))

    def hold(self, name: str, held: bool) -> None:
        """Send engine `name` no new requests (a restart drains it first, so none of its requests
        is cut) or take it back. Its requests in flight run on; the other ready engines take the
        arrivals, and only when none is left do arrivals wait in the queue."""
        self.upstreams[name].held = held
        self.refresh_open()

    @property
    def held(self) -> bool:
        """The queue is held for a restart: an engine is held and no other can take requests."""
        ups = self.upstreams.values()
        return any(u.held for u in ups) and not any(u.routable for u in ups)

    def mark_down(self, up: Upstream) -> None:
        """The engine refused a connection: hold requests until the daemon sees it ready again."""
        up.ready = False
        up.down_at = time.monotonic()
        self.refresh_open()

    def pick(self) -> Upstream | None:
        ready = [u for u in self.upstreams.values() if u.routable]
        return min(ready, key=lambda u: u.outstanding) if ready else None

    def api_keys(self) -> list[str]:
        """Every engine's key, other hosts' included: any of them means the door needs a key."""
        return [u.api_key for u in self.upstreams.values() if u.api_key]

    def door_keys(self) -> list[str]:
        """The keys a client may give at this group's door besides the gateway's: this host's
        engines' own. An engine of another host keeps its key to itself: a client holding it
        reaches that engine, not the rest of the group."""
        return [u.api_key for u in self.upstreams.values() if u.api_key and not u.remote]

    def authorized(self, header: str | None) -> bool:
        """This host's engines' API keys guard the group's door too; no key set means an open
        door. A key only another host's engine has closes the door to everything but the
        gateway's own key (which the gateway checks)."""
        if not self.api_keys():
            return True
        keys = self.door_keys()
        given = (header or "").removeprefix("Bearer ").strip().encode()
        return any(hmac.compare_digest(given, k.encode()) for k in keys)

    # --- measurements and the controller --------------------------------------------------

    def first_token(self, engine_ttft_s: float) -> None:
        """A streamed request's first token passed: its TTFT counts now, not when it ends."""
        self.controller.observe(LatencySample(at_s=time.monotonic(), ttft_s=engine_ttft_s))

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        self.outcomes[rec.outcome] += 1
        if rec.outcome == OK and rec.engine_e2e_s is not None:
            self.controller.observe(
                LatencySample(
                    at_s=time.monotonic(),
                    ttft_s=rec.engine_ttft_s,
                    e2e_s=rec.engine_e2e_s,
                    output_chunks=rec.output_chunks,
                    output_tokens=rec.output_tokens,
                    count_ttft=False,
                )
            )

    def step(self, now_s: float | None = None) -> TraceSample | None:
        """One controller step; the admission gate takes the new window at once."""
        if not self.controlled:
            return None
        sample = self.controller.step(now_s, saturated=self.admission.take_saturated())
        self.admission.set_window(self.controller.window)
        return sample

    def set_window(self, window: int) -> None:
        self.controller.set_window(window)
        self.admission.set_window(self.controller.window)

    def freeze(self, frozen: bool) -> None:
        self.controller.freeze(frozen)

    def configure(self, **changes: Any) -> None:
        """PidSettings fields as JSON gives them; see PidController.configure."""
        self.controller.configure(**changes)
        self.admission.set_window(self.controller.window)

    def retry_after_s(self) -> int:
        """A hint for a rejected client: about how long the queue ahead takes to drain."""
        recent = [r.engine_e2e_s for r in list(self.records)[-64:] if r.engine_e2e_s is not None]
        per_request_s = statistics.median(recent) if recent else 1.0
        waves = (self.admission.queued + self.admission.in_flight) / max(1, self.admission.window)
        return max(1, min(60, round(per_request_s * waves)))

    def state_json(self, trace_points: int = 60) -> dict[str, Any]:
        st = self.admission.stats()
        # Of the newest requests that succeeded, how many streamed: a TTFT or TPOT signal comes
        # only from streams, so a client can say why such a signal has no samples.
        ok = [r for r in itertools.islice(reversed(self.records), 64) if r.outcome == "ok"]
        return {
            "recent_ok": len(ok),
            "recent_streamed": sum(1 for r in ok if r.streamed),
            **self.controller.state_json(trace_points),
            "group": self.name,
            "window": st.window,
            "controlled": self.controlled,
            "in_flight": st.in_flight,
            "queued": st.queued,
            "open": st.open,
            "max_queue": self.admission.max_queue,
            "queue_timeout_s": self.admission.queue_timeout_s,
            "admitted_total": st.admitted_total,
            "rejected_full_total": st.rejected_full_total,
            "timed_out_total": st.timed_out_total,
            "max_in_flight_seen": st.max_in_flight_seen,
            "engines": {
                u.name: {
                    "url": u.url,
                    "ready": u.ready,
                    "held": u.held,
                    "outstanding": u.outstanding,
                    "requests": u.requests,
                    "resent": u.resent,
                    "remote": u.remote,
                }
                for u in self.upstreams.values()
            },
        }
