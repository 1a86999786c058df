"""What a load run sends: lengths, arrivals, and prompts of an exact token count.

Prompts are built with the engine's own tokenizer (the model directory's `tokenizer.json`, or
transformers' AutoTokenizer for anything else): random token ids are decoded to text and the
text re-encoded until it is exactly the wanted length, the way vLLM's benchmark builds its
random dataset. The engine then counts the same number of prompt tokens we planned for.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

Arrival = Literal["closed", "poisson", "gamma"]


@dataclass(frozen=True)
class LengthDist:
    """A length in tokens: fixed, uniform in [low, high], or lognormal around a median."""

    kind: Literal["fixed", "uniform", "lognormal"]
    value: int  # fixed: the length; uniform: low; lognormal: the median
    high: int | None = None  # uniform only
    sigma: float = 0.5  # lognormal only: the spread of log(length)
    max_value: int | None = None

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """`64`, `uniform:32-128`, `lognormal:64` or `lognormal:64:0.8` (median, sigma)."""
        t = text.strip()
        try:
            if t.isdigit():
                return cls.fixed(int(t))
            kind, _, rest = t.partition(":")
            if kind == "uniform":
                lo, _, hi = rest.partition("-")
                d = cls("uniform", int(lo), int(hi))
            elif kind == "lognormal":
                median, _, sigma = rest.partition(":")
                d = cls("lognormal", int(median), None, float(sigma) if sigma else 0.5)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"length {text!r} is not N, uniform:LOW-HIGH or lognormal:MEDIAN[:SIGMA]") from None
        d.check()
        return d

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        d = cls("fixed", n)
        d.check()
        return d

    def check(self) -> None:
        if self.value < 1:
            raise ValueError(f"a length must be at least 1 token, not {self.value}")
        if self.kind == "uniform" and (self.high is None or self.high < self.value):
            raise ValueError(f"uniform lengths need LOW <= HIGH ({self.value}-{self.high})")
        if self.kind == "lognormal" and not (0 < self.sigma <= 3):
            raise ValueError(f"lognormal sigma must be in (0, 3], not {self.sigma}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            n = self.value
        elif self.kind == "uniform":
            assert self.high is not None, "check() requires HIGH of a uniform length"
            n = rng.randint(self.value, self.high)
        else:
            n = round(rng.lognormvariate(math.log(self.value), self.sigma))
        n = max(1, n)
        return min(n, self.max_value) if self.max_value else n

    def describe(self) -> str:
        if self.kind == "fixed":
            return str(self.value)
        if self.kind == "uniform":
            return f"uniform:{self.value}-{self.high}"
        return f"lognormal:{self.value}:{self.sigma:g}"


@dataclass(frozen=True)
class Workload:
    """A bounded load run: how many requests, how they arrive, how long they are."""

    num_requests: int
    input_len: LengthDist
    output_len: LengthDist
    arrival: Arrival = "closed"
    concurrency: int | None = None  # closed loop: the streams; open loop: an optional cap
    rate_req_s: float | None = None  # open loop only
    burstiness: float = 1.0  # gamma shape: 1 is Poisson, < 1 burstier, > 1 smoother
    warmup_requests: int = 0  # sent first, left out of every figure
    max_duration_s: float | None = None
    ignore_eos: bool = True  # fixed output lengths, whatever the model would say
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("num_requests must be at least 1")
        if self.warmup_requests < 0:
            raise ValueError("warmup_requests must be >= 0")
        if self.arrival == "closed":
            if not self.concurrency or self.concurrency < 1:
                raise ValueError("a closed loop needs a concurrency of at least 1")
        else:
            if self.rate_req_s is None or not self.rate_req_s > 0 or not math.isfinite(self.rate_req_s):
                raise ValueError("an open loop needs a rate above 0 requests/s")
            if self.concurrency is not None and self.concurrency < 1:
                raise ValueError("a concurrency cap must be at least 1")
        if not self.burstiness > 0:
            raise ValueError("burstiness must be above 0")
        if self.max_duration_s is not None and not self.max_duration_s > 0:
            raise ValueError("max_duration_s must be above 0")

    # `kw`: any other field (warmup_requests, seed, ...), passed through to the constructor.
    @classmethod
    def closed(
        cls, concurrency: int, num_requests: int, input_len: int | LengthDist, output_len: int | LengthDist, **kw: Any
    ) -> Workload:
        return cls(num_requests, _dist(input_len), _dist(output_len), "closed", concurrency=concurrency, **kw)

    @classmethod
    def open(
        cls,
        rate_req_s: float,
        num_requests: int,
        input_len: int | LengthDist,
        output_len: int | LengthDist,
        burstiness: float = 1.0,
        **kw: Any,
    ) -> Workload:
        arrival: Arrival = "poisson" if burstiness == 1.0 else "gamma"
        return cls(
            num_requests,
            _dist(input_len),
            _dist(output_len),
            arrival,
            rate_req_s=rate_req_s,
            burstiness=burstiness,
            **kw,
        )

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "num_requests": self.num_requests,
            "input_len": self.input_len.describe(),
            "output_len": self.output_len.describe(),
            "arrival": self.arrival,
            "warmup_requests": self.warmup_requests,
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
        }
        if self.concurrency is not None:
            d["concurrency"] = self.concurrency
        if self.arrival != "closed":
            d.update(rate_req_s=self.rate_req_s, burstiness=self.burstiness)
        if self.max_duration_s is not None:
            d["max_duration_s"] = self.max_duration_s
        return d

    def arrival_offsets_s(self, n: int, rng: random.Random) -> list[float]:
        """When each of n requests is due, from the start (open loop; gamma with mean 1/rate)."""
        if self.rate_req_s is None:
            raise ValueError("a closed loop has no arrival times")
        t, out = 0.0, []
        theta = 1.0 / (self.rate_req_s * self.burstiness)
        for _ in range(n):
            out.append(t)
            t += rng.gammavariate(self.burstiness, theta)
        return out


def _dist(v: int | LengthDist) -> LengthDist:
    return v if isinstance(v, LengthDist) else LengthDist.fixed(v)


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    warmup: bool
    stream: bool = True
    priority: int = 0  # sent only when not 0


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class _FastTokenizer:
    """`tokenizers` on the model's tokenizer.json: loads in milliseconds, no transformers."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        self._tok = HfTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        self._special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def special_ids(self) -> set[int]:
        return self._special


class _AutoTokenizer:
    def __init__(self, name: str) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(name)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=True)
        return ids

    def decode(self, ids: list[int]) -> str:
        # transformers types decode() for a batch of id lists too (-> list[str]); one list is one str.
        return self._tok.decode(ids, skip_special_tokens=True)  # type: ignore[return-value]

    def special_ids(self) -> set[int]:
        return set(self._tok.all_special_ids)


def load_tokenizer(model: str) -> Tokenizer:
    """The engine's tokenizer from its model directory (or hub name, through transformers)."""
    p = Path(model).expanduser()
    if (p / "tokenizer.json").is_file():
        return _FastTokenizer(p / "tokenizer.json")
    return _AutoTokenizer(model)


def _prompt_ids(tok: Tokenizer) -> list[int]:
    """Token ids fit for random prompts, computed once per tokenizer (kept on it).

    Byte-level vocabularies hold partial UTF-8 sequences; decoded alone they become U+FFFD,
    which encodes to other tokens and keeps the count from ever settling. Whole characters only.
    """
    pool: list[int] | None = getattr(tok, "_prompt_pool", None)
    if pool is None:
        special_ids: Callable[[], set[int]] | None = getattr(tok, "special_ids", None)
        special = special_ids() if special_ids is not None else set()
        pool = [i for i in range(tok.vocab_size) if i not in special and "\ufffd" not in tok.decode([i])]
        setattr(tok, "_prompt_pool", pool)  # noqa: B010 - a cache the Tokenizer protocol does not declare
    return pool


def exact_prompt(tok: Tokenizer, n_tokens: int, rng: random.Random, max_tries: int = 20) -> str:
    """Text that `tok` encodes to exactly n_tokens tokens (special tokens included).

    Decoding random ids and encoding the text again can merge or split tokens, so the ids are
    trimmed or topped up until the count settles; a tokenizer that never settles is an error,
    not a silently different workload.
    """
    pool = _prompt_ids(tok)
    overhead = len(tok.encode(""))
    for _fresh_start in range(5):  # some random starts oscillate around the target: try another
        ids = [rng.choice(pool) for _ in range(max(0, n_tokens - overhead))]
        for _ in range(max_tries):
            text = tok.decode(ids)
            encoded = tok.encode(text)
            got = len(encoded)
            if got == n_tokens:
                return text
            ids = encoded[overhead:] if overhead else encoded
            if got > n_tokens:
                ids = ids[: max(0, len(ids) - (got - n_tokens))]
            else:
                ids = ids + [rng.choice(pool) for _ in range(n_tokens - got)]
    raise ValueError(f"could not build a prompt of exactly {n_tokens} tokens with this tokenizer")


def plan_requests(workload: Workload, tok: Tokenizer) -> list[PlannedRequest]:
    """Every request of the run, warm-up first, from the workload's seed (repeatable)."""
    rng = random.Random(workload.seed)
    total = workload.warmup_requests + workload.num_requests
    out = []
    for i in range(total):
        n_in = workload.input_len.sample(rng)
        n_out = workload.output_len.sample(rng)
        out.append(PlannedRequest(i, exact_prompt(tok, n_in, rng), n_in, n_out, i < workload.warmup_requests))
    return out
