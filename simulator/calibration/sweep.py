"""The calibration sweep: which request bursts to measure, so that the fit (`simulator.calibration.fit`)
can tell the step-time terms apart.

The sweep has two kinds of points, each a burst of identical requests sent at once to an idle
server with no shared prefix:

- ``prefill``: one request of P prompt tokens and one output token; measured: its TTFT (the sum of
  its prefill steps, chunked by the token budget);
- ``prefill`` after a pause (``idle`` > 0): the same, sent once the server has been idle that long;
  the difference to the back-to-back point is the engine's ``idle_wake``;
- ``decode`` after a pause: the long single decode (`LONG_OUTPUT` tokens) sent once the server has
  been idle that long; beyond the wake-up of its first step, its steps in the first ``wake_period``
  are slower by ``wake_slowdown`` (the hardware coming back to speed);
- ``prefill`` of a cached prompt (``cached``): the same prompt sent twice, the second timed; the prefix
  cache holds all its full blocks but the last token's, so what grows with P is the request's handling
  in the API server (``frontend_per_prompt_token``: parsing, block hashing), not prefill compute;
- ``prefill`` after one of the same size (``same_size``): a request of as many prompt tokens (other
  tokens) runs just before, untimed, so the timed one's step finds its kernels built; the difference
  to a prefill of a size the server has not run lately is ``per_new_shape`` (a live sweep makes the
  other points' prompt lengths new by a few tokens each time, `simulator.calibration.on_server`);
- ``prefill`` bursts (B > 1): B requests sent at once; the API server hands them to the engine one
  after another (``frontend_per_request``), so the later ones miss the first step;
- ``decode``: B requests of P prompt tokens and O output tokens, their prompts already in the prefix
  cache but for the last token (so the burst is decode steps, not prefills); measured: the mean
  end-to-end latency over the requests (a one-token prefill, then O - 1 decode steps of up to B
  sequences at growing context). End to end rather than inter-token: a busy server merges several
  tokens into one streamed chunk, which delays the first token and shortens the gaps, but leaves the
  end in place.
- ``loaded``: N streams decode (`loaded_stream`: cached one-block prompts, so they prefill a token
  each) while calls of P prompt tokens are sent at set times after them (`probe_offsets`); measured:
  the calls' mean TTFT. With short calls it is the API server's per-token work
  (``frontend_per_output_token``): every step the streams' N tokens pass the API server before a new
  call's first token, and a call arriving meanwhile waits for them; with long prompts it is steps that
  mix a prefill chunk with N decodes, which no other point has. With streams of a long context
  (``stream_context``: cached prompts of that many tokens) the calls' steps mix a prefill with decodes
  that attend thousands of tokens each (``per_mixed_context_token``), as an agent's calls meet the
  long-context decodes of other agents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..sim.profile import ServerProfile

LONG_OUTPUT = 160
"""Output tokens of the sweep's long single decodes (five times the other decode points')."""

WAKE_PAUSE = 0.5
"""Seconds of quiet before the sweep's wake-up points: well past any `idle_after` a server needs."""

LOADED_STREAMS = (8, 16, 48, 96, 192)
"""Streams decoding under the sweep's loaded points (those the server's `max_num_seqs` leaves a seat
beside): from where the API server's per-token work is a small share of a step to where it is most."""
LOADED_SHORT = 32
"""Prompt tokens of the short calls sent under load."""
LOADED_MIXED = ((16, 1024), (48, 2048), (96, 512))
"""(streams, prompt tokens) of the loaded points whose calls are long prefills: steps that mix a
prefill chunk (a whole step's budget at 2,048 on a 2,048-token server) with the streams' decodes."""
LOADED_LONG = ((8, 2048, LOADED_SHORT), (8, 2048, 512))
"""(streams, stream context, prompt tokens) of the loaded points whose streams decode at a long
context: short and longer calls whose steps mix their prefill with decodes attending 2,048 tokens each
(the context capped at half the model's limit). Beside the short calls among as many streams of one
block (`LOADED_STREAMS` has 8), which wait for the API server's tokens alike, they show what the
streams' context costs in the mixed steps."""
PROBES = 8
"""Calls sent under load at each loaded point (half as many of long prompts)."""
PROBE_SPACING = 0.083
"""Seconds between them (no multiple of a typical step, so they meet steps at different phases); more
for long prompts (a 1,024-token prompt's call twice this, a 2,048-token one's three times), so that
each finds the one before it done."""
PROBE_LEAD = 0.15
PROBE_LEAD_PER_STREAM = 0.003
"""The first call goes this long after the streams were sent: a fixed part and a part per stream,
the time an API server takes to let that many requests in (about 3 ms each on the CPU test server), so
that the calls find the streams decoding."""
STREAM_TOKENS = 8192
"""Output tokens of a loaded point's streams together (each within `STREAM_OUTPUT`): each point then
takes about as long, and its streams outlast its calls on the CPU test server with a margin."""
STREAM_OUTPUT = (96, 384)
"""Fewest and most output tokens of one stream."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One measurement of the sweep."""

    kind: str
    """'prefill' (value: TTFT), 'decode' (value: mean end-to-end latency) or 'loaded' (value: mean
    TTFT of calls sent while `concurrency` streams decode)."""
    concurrency: int
    """Requests of the burst (of a loaded point: its streams)."""
    input_tokens: int
    output_tokens: int
    idle: float = 0.0
    """Seconds the server is left idle before the burst is sent."""
    cached: bool = False
    """Each request's prompt is sent once just before the burst (untimed), so the prefix cache holds
    its whole blocks (of a loaded point: its streams' prompts)."""
    same_size: bool = False
    """A request of as many prompt tokens (no prefix shared) runs just before, untimed: the burst's
    step sizes have their kernels built (`per_new_shape`)."""
    stream_context: int = 0
    """Of a loaded point: its streams' cached context in tokens (0: one block)."""

    def label(self) -> str:
        if self.kind == "loaded":
            context = f" C={self.stream_context}" if self.stream_context else ""
            return f"loaded N={self.concurrency}{context} P={self.input_tokens} O={self.output_tokens}"
        pause = f" after {self.idle:g} s idle" if self.idle else ""
        prompt = " cached" if self.cached else " after one of its size" if self.same_size else ""
        return f"{self.kind} B={self.concurrency} P={self.input_tokens}{prompt} O={self.output_tokens}{pause}"


def loaded_stream(point: SweepPoint, block_size: int) -> tuple[int, int]:
    """(prompt, output) tokens of each stream of a loaded point: its `stream_context` (or one block) in
    the prefix cache and a token, so that each prefills one token, and `STREAM_TOKENS` output tokens
    shared out."""
    low, high = STREAM_OUTPUT
    return (point.stream_context or block_size) + 1, min(high, max(low, STREAM_TOKENS // point.concurrency))


def probe_offsets(point: SweepPoint) -> list[float]:
    """Seconds after a loaded point's streams were sent at which each of its calls is sent."""
    lead = PROBE_LEAD + PROBE_LEAD_PER_STREAM * point.concurrency
    short = point.input_tokens <= LOADED_SHORT
    spacing = PROBE_SPACING * (1 + point.input_tokens // 1024)
    return [lead + spacing * k for k in range(PROBES if short else PROBES // 2)]


def design_sweep(profile: ServerProfile, *, max_concurrency: Optional[int] = None,
                 max_prompt: Optional[int] = None) -> list[SweepPoint]:
    """A sweep that separates the terms: prompt lengths up to the context limit for prefill; batch
    sizes up to `max_num_seqs` (or `max_concurrency`) crossed with short and long contexts for decode,
    plus single requests decoding at several more contexts, leaving out bursts whose KV blocks exceed
    the cache, and points of prompts longer than `max_prompt` (when given)."""
    s, kv = profile.scheduler, profile.kv_cache
    limit = s.max_model_len
    top = min(s.max_num_seqs, max_concurrency or s.max_num_seqs)
    points = []
    lengths = {16, 64, 256, 512, 1024, 2048, 4096, 16384, 65536}
    if limit <= 65536:
        lengths.add(limit - 1)  # the longest prompt the server takes
        lengths.add(limit * 3 // 4)  # and one between: the curvature of prefill attention
    for p in sorted(lengths):
        if p + 1 <= limit:
            points.append(SweepPoint("prefill", 1, p, 1))
    for p in (64, 1024):
        if p + 1 <= limit:
            points.append(SweepPoint("prefill", 1, p, 1, idle=WAKE_PAUSE))
            points.append(SweepPoint("prefill", 1, p, 1, same_size=True))
    # cached prompts of whole blocks and one token more: the warm-up leaves all the blocks cached, and
    # the timed request computes a single token after them
    bs = kv.block_size
    for p in sorted({1024, 4096, 16384, 65536, (limit - 2) // bs * bs} - {0}):
        if p + 2 <= limit:
            points.append(SweepPoint("prefill", 1, p + 1, 1, cached=True))
    for b, p in ((4, 16), (16, 16), (4, 1024)):
        if b <= top and b * -(-(p + 1) // bs) <= kv.capacity_blocks:
            points.append(SweepPoint("prefill", b, p, 1))
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b <= top} | {top})
    output = 32
    # a long context near the model's limit separates the attended-context term from per-sequence costs
    long_context = (limit * 3 // 4) // 64 * 64
    contexts = {64, 1024, 8192}
    if 8192 + output > limit:
        contexts.add(long_context)
    # single requests at more contexts: the cleanest rows for the attended-context term
    singles = {256, 512, 2048, 4096, 16384, limit // 2 // 64 * 64} - contexts
    for context in sorted(contexts | singles):
        # prompts of a block or more are cached beforehand, but for one token: the burst then measures
        # its decode steps, not the prefills that would otherwise make most of its time
        cached = context >= bs
        prompt = context + 1 if cached else context
        if prompt + output > limit or context <= 0:
            continue
        for b in (batches if context in contexts else [1]):
            # a burst the KV cache cannot hold would measure preemption, not steps
            if b * -(-(prompt + output) // bs) <= kv.capacity_blocks:
                points.append(SweepPoint("decode", b, prompt, output, cached=cached))
    # single requests of a longer output at two contexts: with every other decode point at 32 tokens,
    # what a decode step costs and what a request costs once would otherwise rest on the prefill points
    for context in (64, 1024):
        cached = context >= bs
        prompt = context + 1 if cached else context
        if prompt + LONG_OUTPUT <= limit:
            points.append(SweepPoint("decode", 1, prompt, LONG_OUTPUT, cached=cached))
            if context == 64:  # and once after a pause: the steps of an engine warming up again
                points.append(SweepPoint("decode", 1, prompt, LONG_OUTPUT, cached=cached, idle=WAKE_PAUSE))
    # calls sent while streams decode, each stream and call with a seat and blocks of its own: short
    # calls (the API server's work per streamed token), long prefills (steps mixing prefill and decode)
    # and calls among streams of a long context (steps mixing a prefill with long-context decodes)
    loaded = [(n, 0, LOADED_SHORT) for n in LOADED_STREAMS] + [(n, 0, p) for n, p in LOADED_MIXED]
    loaded += [(n, min(c, limit // 2 // bs * bs), p) for n, c, p in LOADED_LONG if limit // 2 >= 2 * bs]
    for n, context, p in loaded:
        point = SweepPoint("loaded", n, p, 1, cached=True, stream_context=context)
        prompt, output = loaded_stream(point, bs)
        blocks = n * -(-(prompt + output) // bs) + PROBES * -(-(p + 1) // bs)
        if n < top and prompt + output <= limit and p + 1 <= limit and blocks <= kv.capacity_blocks:
            points.append(point)
    if max_prompt:
        points = [p for p in points if p.input_tokens <= max_prompt]
    return points


def cached_prompts(point: SweepPoint, block_size: int, first: int = 0,
                   tokens: Optional[int] = None) -> list[tuple[int, ...]]:
    """The hash ids of a cached point's prompts (of `tokens` each, default the point's input tokens),
    one run of its own per request from `first`: each request's whole blocks, warmed into the prefix
    cache by sending them once before the burst."""
    n = (point.input_tokens if tokens is None else tokens) // block_size
    return [tuple(range(first + i * n, first + (i + 1) * n)) for i in range(point.concurrency)]
