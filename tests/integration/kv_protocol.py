"""One request sequence replayed step by step against a KV cache manager: vLLM's or the twin's.

Plain Python without dependencies: the vLLM side (`vllm_kv_replay.py`, run with vLLM's own Python)
and the twin side (`test_vllm_kv_cache.py`) both import it, so both caches see exactly the same
operations. An *engine* adapts one cache to four calls:

- ``new_step()``: a scheduler step begins;
- ``admit(req, budget)``: look the waiting request up and allocate its first chunk of at most
  `budget` tokens; returns (tokens scheduled, hit tokens) or None when it does not fit (or the
  cache defers it), which stops admission for the step;
- ``step(req, budget)``: allocate the running request's next chunk (a prefill chunk of at most
  `budget` tokens, or one decode token); returns the tokens scheduled (0: skipped this step) or None
  when its blocks do not fit;
- ``sampled(req)``: a step produced the request's next token (``req.generated`` counts it);
- ``free(req)``: the request ended or was preempted;

plus ``evictions()`` and ``free_blocks()`` for the figures compared after every step (and, when the
engine has it, ``slack()``: blocks by which its free count may differ from another's, recorded too). The loop is a
small vLLM scheduler: running requests first, oldest first, each preempting the newest running ones
until it fits; then waiting requests first come first served while the step's token budget and
`window` seats allow; a request whose prefill ends samples a token, then decodes one token a step.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class Req:
    """One request of the sequence and its progress."""

    def __init__(self, index: int, prompt: int, out: int, hash_ids: list[int], block: int) -> None:
        self.index = index
        self.prompt = prompt
        self.out = max(1, out)
        self.hash_ids = hash_ids
        self.block = block
        self.computed = 0
        self.generated = 0
        self.target = prompt
        """Tokens its current prefill computes (the prompt, plus output after a preemption)."""
        self.running = False
        self.hit: int | None = None
        self.handle: Any = None
        """The engine's own record of the request."""

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def decoding(self) -> bool:
        return self.running and self.computed >= self.target


def requests_from(data: list[dict]) -> list[Req]:
    """The sequence from its JSON form: ``{"in", "out", "hash_ids", "block_size"}`` each."""
    return [Req(i, r["in"], r["out"], list(r["hash_ids"]), r["block_size"]) for i, r in enumerate(data)]


def replay(requests: list[Req], engine: Any, *, budget: int, window: int, max_steps: int = 1_000_000) -> dict:
    """Run the sequence to the end; returns what is compared: per request its first hit (tokens)
    and its chunks, per step the evictions so far and the free blocks, and the preemptions."""
    waiting: deque[Req] = deque(requests)
    running: list[Req] = []
    evictions: list[int] = []
    free: list[int] = []
    slack: list[int] = []
    chunks: dict[int, list[int]] = {r.index: [] for r in requests}
    preemptions: list[tuple[int, int]] = []
    step = 0
    while waiting or running:
        step += 1
        if step > max_steps:
            raise RuntimeError("replay did not finish")
        engine.new_step()
        left = budget
        scheduled: list[tuple[Req, int]] = []
        preempted = False
        i = 0
        while i < len(running):
            req = running[i]
            n = engine.step(req, left if not req.decoding else min(1, left))
            while n is None:  # preempt the newest until it fits (or it was the newest)
                preempted = True
                victim = running.pop()
                engine.free(victim)
                preemptions.append((step, victim.index))
                victim.running = False
                victim.computed = 0
                victim.target = victim.num_tokens
                waiting.appendleft(victim)
                if victim is req:
                    break
                n = engine.step(req, left if not req.decoding else min(1, left))
            if n is None:
                continue
            if n:
                scheduled.append((req, n))
                left -= n
            i += 1
        while not preempted and waiting and left > 0 and len(running) < window:
            req = waiting[0]
            got = engine.admit(req, left)
            if got is None:
                break
            n, hit = got
            waiting.popleft()
            if req.hit is None:
                req.hit = hit
            req.computed = hit
            req.running = True
            running.append(req)
            scheduled.append((req, n))
            left -= n
        for req, n in scheduled:  # the step's results
            chunks[req.index].append(n)
            req.computed += n
            if req.computed >= req.target:
                req.generated += 1
                engine.sampled(req)
        for req in [r for r in running if r.generated >= r.out and r.computed >= r.target]:
            running.remove(req)
            engine.free(req)
            req.running = False
        evictions.append(engine.evictions())
        free.append(engine.free_blocks())
        slack.append(engine.slack() if hasattr(engine, "slack") else 0)
    return {
        "hits": [r.hit for r in requests],
        "chunks": [chunks[r.index] for r in requests],
        "evictions": evictions,
        "free": free,
        "slack": slack,
        "preemptions": preemptions,
        "steps": step,
    }


def prompt_tokens(req: Req) -> list[int]:
    """Token ids for a request's prompt: each trace block's tokens follow from its hash id (equal ids
    give equal tokens), the rest of the prompt is unique to the request."""
    tokens: list[int] = []
    block = req.block
    for hid in req.hash_ids[: req.prompt // block]:
        base = (hid + 1) * block
        tokens.extend(range(base, base + block))
    first = (10**9 + req.index) * 10**7
    tokens.extend(range(first, first + req.prompt - len(tokens)))
    return tokens


def output_token(req: Req, k: int) -> int:
    """The k-th generated token of a request (unique to it)."""
    return (2 * 10**9 + req.index) * 10**7 + k
