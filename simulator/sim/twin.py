"""The server twin: a SimPy model of a continuous-batching server as vLLM's V1 scheduler runs it.

The engine runs as callbacks on its own SimPy events (a process, without the cost of resuming one),
in the order a process stepping it would; requests are events it resolves. Each step:

1. Running requests, oldest first, take their tokens from the step's budget (`max_num_batched_tokens`):
   a decoding request 1 + k tokens (k draft tokens with speculative decoding), a request still in
   prefill the next chunk of its prompt. Each grows its KV blocks to cover the tokens; when the cache
   has no room, the newest running request is preempted (blocks freed, back to the front of the
   waiting queue, its progress recomputed later), until the request fits or was itself preempted.
2. If nobody was preempted, waiting requests are admitted first come first served while the running
   set is below `max_num_seqs` and budget is left: the prefix cache gives their leading cached blocks
   (at least one prompt token is always computed), the rest is prefilled, in chunks when
   `chunked_prefill` is on. A request that does not fit stops admission.
3. The step lasts what the step-time model says, and `per_new_shape` more when its count of scheduled
   tokens is not among the last `shape_cache` counts run (kernels built for a new size). After an
   idle longer than `idle_after` the first step pays `idle_wake` and the steps of the next
   `wake_period` seconds last `wake_slowdown` longer (the hardware coming back to speed). The step
   after one in which requests finished their prefill and go on decoding pays `batch_join`, the step
   after one in which requests ended `batch_leave` (the engine's batch state changing); and a step is
   stretched by `frontend_contention` times the API server's intake work done inside it (work begun
   after the step was planned stretches the next one), the engine losing its core to it. At its end
   prefills advance, a finished prefill emits the first token, decodes emit their tokens, and
   finished requests free their blocks.

Speculative decoding emits (1 - a^(k+1)) / (1 - a) tokens per decode step on average; the twin emits
that rate deterministically, the same count for every sequence in a step (floor((g+1)E) - floor(gE) at
step g), so runs are reproducible and a run of decode steps can be advanced at once. Asynchronous
scheduling is modelled by its effect on step time only (see `step_time`), not by a one-step lag.
A request sent at the instant another ends (a closed-loop client's next call) is seen by the next step.
The API server in front of the engine is one worker, first come first served (vLLM 0.32.0's API server
is one asyncio loop: `AsyncLLM`'s output handler and the request handlers share it). A new request
takes it for `frontend_per_request` plus `frontend_per_prompt_token` per prompt token (a burst of
requests queues there and reaches the engine staggered), then waits `request_overhead` of latency that
runs beside everything else before it joins the waiting queue. With `frontend_per_output_token`,
every step's end also gives it the step's tokens, their count times that much work; each token reaches
its client when that work is done (its first token, its gaps and its end are those delivery times), and
a request arriving meanwhile queues behind it. The engine does not wait for the API server: blocks are
freed at the step's end. A request's TTFT and end count from its submission.

Fast path (`fast_decode`, the default): requests that decode step after step are advanced as one
group (`simulator.sim.decode_group`): shared token, block and gap counters, a heap of finish points, so
a step costs the same whatever the batch size, and only requests that change state (admitted,
prefilling, finishing) are looked at one by one. When a step is pure decode, nothing waits that could
be admitted, no batch change or intake work is to be charged to it and no other event is due before
the step's end, the twin advances many decode steps at
once, up to the first finish, the first step boundary at or after the next event in the SimPy queue,
or a KV shortage. Where the group cannot follow the scheduler exactly (its members would not all get
their tokens or their blocks), its members are written back and the step is taken one request at a
time. The records are the same as stepping one by one without the group (tests check this). With
per-token work in the API server, the delivery times of a run's steps are worked out as it is planned,
but for its last step's: nothing reaches the API server before the run's last step begins, since the run
stops at the next event, so its queue is the same as when stepping one by one.

Planning ahead (a fleet's replica, `simulator.fleet.replica`): a twin whose class sets `_plans_ahead`
may plan a run past the next event, up to its `_horizon_ahead`. It keeps the run's step end times, takes
its KV blocks only when it ends (checking when it is planned that they are there), and cuts it short
when a request is sent to it or reaches its waiting queue, or when `sync` is called before its cache is
read and the blocks would evict cached ones: the run then ends at its first step boundary at or after
that moment, as if that moment had been the next event when it was planned, its deliveries to the API
server handed over again. The cut run's end event is cancelled (its callbacks cleared).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict, deque
from dataclasses import dataclass, replace
from itertools import islice, repeat
from operator import attrgetter
from typing import Any, Generator, Generic, Iterator, Optional, Sequence

import simpy

from ..workload import Call
from .decode_group import DecodeGroup
from .kv_cache import Holding, KVCache
from .profile import ServerProfile
from .request import HoldingT, TwinRequest
from .step_time import StepTimeModel

WARM_SHAPES = 16
"""Step sizes 1 to 16 are in the kernel cache (`per_new_shape`) from the start: the small decode
batches an engine in service runs all the time, whose kernels a warmed-up server holds."""

MAX_CHUNK_STEPS = 4096
"""Most decode steps advanced in one go."""


@dataclass(slots=True)
class Completion:
    """What the twin reports when a request ends. Times are SimPy times (seconds)."""

    submitted: float
    first_token: Optional[float]
    end: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    """Prompt tokens served from the prefix cache at the request's first admission."""
    itl_count: int
    """Inter-token gaps (steps emitting tokens after the first)."""
    itl_mean: Optional[float]
    itl_max: Optional[float]
    preemptions: int
    gaps: list[float]
    """Every inter-token gap, when the twin keeps them (`keep_gaps`), else empty."""
    tag: Any = None

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.submitted


@dataclass
class TwinStats:
    """Counters of one twin's run."""

    steps: int = 0
    busy_time: float = 0.0
    prefill_tokens: int = 0
    """Prompt tokens computed (including recomputation after preemption)."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at first admission."""
    queried_tokens: int = 0
    """Prompt tokens looked up in the prefix cache at first admission (vLLM's prefix-cache queries, which
    count neither requests still waiting nor lookups after a preemption)."""
    output_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    fast_chunks: int = 0
    """Times many decode steps were advanced in one go."""
    max_running: int = 0
    settled_steps: int = 0
    """Steps whose decode group had to be written back and stepped one request at a time."""


@dataclass(slots=True)
class _Chunk:
    """A planned run of pure-decode steps."""

    steps: int
    first: float
    """End time of its first step."""
    end: float
    inner_max: float
    """Largest gap between consecutive step ends within the run."""
    inner_gaps: Sequence[float]
    """Those gaps, when the twin keeps gaps."""
    emitted: int
    """Tokens each sequence emits over the run."""
    last_emit: int
    """Tokens each sequence emits in the run's last step."""
    delivered_first: float = 0.0
    """With per-token API-server work: when the first step's tokens reach the clients (if the run has
    more than one step; the gaps above are then between deliveries, the last step's left out)."""
    delivered_before_last: float = 0.0
    """Likewise for the step before the last."""


_Step = tuple[list[TwinRequest], list[tuple[TwinRequest, int]], Optional[_Chunk], float, float]
"""A planned step: (decoding requests outside the group, (request, chunk) prefills, the run of decode
steps it is or None, start, end)."""


@dataclass(slots=True)
class _AheadRun:
    """What the twin keeps of a run of decode steps planned past the next event (`Twin._plans_ahead`),
    to cut it short without planning it again."""

    chunk: _Chunk
    ends: list[float]
    """End time of each of its steps."""
    step_index: int
    """Engine step index of its first step."""
    blocks: int
    """KV blocks it takes when it ends (or less, cut short)."""
    evicts: bool
    """Whether taking them will evict cached blocks (or use prepaid ones)."""
    frontend_free: float
    """The API server's `_frontend_free` before the run's deliveries."""
    timeout: Optional[simpy.Event] = None
    """The event of its end."""


class Twin(Generic[HoldingT]):
    """The engine of one server. `submit` a request, wait on the event it returns for its `Completion`.

    This is the twin of an attention-only model; `simulator.sim.hybrid_twin.HybridTwin` extends it
    for a hybrid (Mamba + attention) one by overriding the hooks below (see "where a hybrid model's
    twin differs"), and `simulator.sim.make_twin.make_twin` builds the one a profile needs. `HoldingT`
    is the class a request's blocks are recorded in (`_holding_class`).

    A twin sharing its environment with other servers' (a fleet's replica, `simulator.fleet.replica`)
    finds its runs of decode steps cut at every event of the others; it may plan them further ahead
    instead (see "planning runs ahead"): the twin then cuts such a run short itself, at its first step
    boundary at or after the moment work reaches it (a request sent or reaching the waiting queue), and
    takes the run's KV blocks at its end or cut, so its records stay those of stepping one by one."""

    _models_hybrid = False
    """Whether this twin models a hybrid model's Mamba layers (a profile with ``kv_cache.hybrid``)."""

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        if (profile.kv_cache.hybrid is not None) != self._models_hybrid:
            raise TypeError(f"{type(self).__name__} cannot model profile {profile.name!r}: "
                            f"build twins with simulator.sim.make_twin.make_twin")
        self.env = env
        self.profile = profile
        self.keep_gaps = keep_gaps
        self.fast_decode = fast_decode
        s, kv = profile.scheduler, profile.kv_cache
        self.max_num_seqs = s.max_num_seqs
        self.budget = s.max_num_batched_tokens
        self.chunked = s.chunked_prefill
        self.max_model_len = s.max_model_len
        self.block_size = kv.kv_block_size
        self.kv = self._make_cache(profile)
        self.model = StepTimeModel.from_profile(profile)
        self.request_overhead = profile.step_time.request_overhead
        self.frontend_per_request = profile.step_time.frontend_per_request
        self.frontend_per_prompt_token = profile.step_time.frontend_per_prompt_token
        self.frontend_per_output_token = profile.step_time.frontend_per_output_token
        self._frontend_free = env.now
        """When the API server is done with the requests and tokens it has been given."""
        self.contention = profile.step_time.frontend_contention
        self._intake: deque[tuple[float, float]] = deque()
        """(begin, end) of the API server's work on new requests that may still overlap a step (with
        `frontend_contention`), oldest first."""
        self._charged: Optional[tuple[float, float]] = None
        """(start, contention charged when planned) of the step under way; None after an idle."""
        self.k = profile.spec_decode.num_tokens
        self.rate = profile.spec_decode.expected_tokens if self.k else 1.0
        self.waiting: deque[TwinRequest[HoldingT]] = deque()
        self.running: list[TwinRequest[HoldingT]] = []
        """Running requests outside the group, all newer than its members, in running order."""
        self.group = self._make_group(keep_gaps)
        """Decoding requests advanced together (fast path only); the oldest part of the running set."""
        self.stats = TwinStats()
        self.clock = env.now
        self._step_index = 0
        self._admitted = 0
        self._decode_terms: dict[int, tuple[float, float, float]] = {}
        """`StepTimeModel.decode_terms` by batch size."""
        self.idle_wake = profile.step_time.idle_wake
        self.idle_after = profile.step_time.idle_after
        self._idle_since = env.now
        self._cold = 0.0
        """Seconds the next step pays for waking from a long idle (`idle_wake` or 0)."""
        self.slow = 1.0 + profile.step_time.wake_slowdown
        self.wake_period = profile.step_time.wake_period
        self._warm_at = -math.inf
        """Steps that start before this pay `wake_slowdown` (the engine warming up after a long idle)."""
        self.batch_join = profile.step_time.batch_join
        self.batch_leave = profile.step_time.batch_leave
        self._churn = 0.0
        """Seconds the next step pays for requests that began decoding or ended in the last one."""
        self.per_new_shape = profile.step_time.per_new_shape
        self.shape_cache = profile.step_time.shape_cache
        self._shapes: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, min(WARM_SHAPES, self.shape_cache) + 1))
        """Step sizes (scheduled tokens) whose kernels the engine holds, least recently used first."""
        self._wake: Optional[simpy.Event] = None
        self._plan: Optional[_Step] = None
        """The latest planned step (None while idle)."""
        self._ahead: Optional[_AheadRun] = None
        """The run of decode steps under way when it was planned past the next event (`_plans_ahead`)."""
        self._unkeyed: list[TwinRequest[HoldingT]] = []
        """Members of the decode group whose prompt is not all keyed yet (`_keys_in_group`), in running
        order and each once, but for those joined since the last step planned (`_unkeyed_joined`)."""
        self._unkeyed_joined = False
        self._keying_tried: dict[TwinRequest[HoldingT], Optional[tuple]] = {}
        """The tree as each of them last tried to key more (`KVCache.keying_state`)."""
        env.process(self._start())

    # ---- where a hybrid model's twin differs (hooks `simulator.sim.hybrid_twin` overrides) ----------

    def _make_cache(self, profile: ServerProfile) -> KVCache:
        """The KV cache of `profile`'s server."""
        kv = profile.kv_cache
        return KVCache(kv.capacity_blocks, kv.block_size, kv.enable_prefix_caching)

    def _make_group(self, keep_gaps: bool) -> DecodeGroup:
        """The decode group (see `simulator.sim.decode_group`)."""
        return DecodeGroup(self.block_size, keep_gaps)

    _holding_class: type = Holding
    """What a request's blocks are recorded in (`simulator.sim.kv_cache.Holding` or a subclass)."""

    _limits_chunks = False
    """Whether `_chunk_limit` may shorten a run of decode steps."""

    def _group_takes(self, blocks: int) -> bool:
        """Whether the decode group, stepped as a whole, may take the `blocks` (more than 0) its
        members' growth needs this step; taking them if so. False steps its members one by one."""
        return self.kv.take(blocks)

    def _prefill_chunk(self, req: TwinRequest[HoldingT], tokens: int) -> int:
        """Prefill tokens a step schedules for a running request still in prefill, given the `tokens`
        (at least 1) its prompt and the step's budget leave it; 0 skips it this step."""
        return tokens

    def _grow(self, req: TwinRequest[HoldingT], tokens: int) -> bool:
        """Give a running request the blocks for a step that brings it to `tokens` computed tokens;
        False (nothing changed) when they do not fit."""
        hold = req.hold
        return tokens <= hold.blocks * self.block_size or self.kv.grow(hold, tokens)

    def _hit(self, req: TwinRequest[HoldingT], tokens: int) -> Optional[tuple[Any, int]]:
        """A waiting request's prefix-cache hit for its `tokens` tokens: (the cache's match, tokens it
        serves, fewer than `tokens`); None when the request may not be admitted this step (admission
        stops)."""
        kv, bs = self.kv, self.block_size
        match = kv.lookup(req.hold, (tokens - 1) // bs)
        return match, kv.cached_blocks(req.hold, match) * bs

    def _admit_blocks(self, req: TwinRequest[HoldingT], match: Any, tokens: int, computed: int, chunk: int) -> int:
        """Hold a waiting request's hit (`match` of `_hit`, serving `computed` of its `tokens`) and
        allocate the first prefill chunk of at most `chunk` tokens after it: the chunk's tokens, or 0
        (nothing changed) when the request cannot be admitted this step (admission stops)."""
        return chunk if self.kv.admit(req.hold, match, computed + chunk) else 0

    def _may_join(self, req: TwinRequest[HoldingT]) -> bool:
        """Whether a decoding request may join the decode group: its blocks are only private ones from
        now on, or (`_keys_in_group`) the group keys the rest for it."""
        hold = req.hold
        # its next growth may still add keyed blocks to the tree: it keeps its place in line
        return not (self.kv.prefix_caching and hold.keyed_tb < len(hold.ids))

    _keys_in_group = False
    """Whether members whose prompt is not all keyed yet may join the group, which then tries to key the
    rest for them at each step it plans (`_key_members`). Exact only where any growth of a member's
    blocks settles the group (a hybrid model's twin): between growths, keying the rest of a prompt
    depends on the tree alone, which no member changes and which stays as it is through a run of
    decode steps."""

    # ---- planning runs ahead (hooks a fleet's replica overrides: `simulator.fleet.replica`) --------

    _plans_ahead = False
    """Whether runs of decode steps may be planned past the next event (`_horizon_ahead`)."""

    def _horizon_ahead(self, step_s: float) -> float:
        """With `_plans_ahead`: the time a run of decode steps planned now may run to (its last step the
        first to end at or after it) when that is later than the next event in the environment, the
        twin alone's horizon; `step_s` is the run's first step's duration. The run is then cut short
        when work reaches the twin before its end (`_cut_run`), so any horizon keeps the records the
        same: a later one saves planning runs, and costs the steps planned past a cut."""
        return -math.inf

    def sync(self, held: bool = False) -> None:
        """Bring the KV cache to where stepping one by one has it now, for a reader outside the twin (a
        router's lookup): a run of decode steps planned ahead whose blocks will evict cached ones is cut
        short now; with `held` (a reader of the blocks held: a /metrics sample), one that takes any
        blocks. Nothing to do for a twin that does not plan ahead."""
        ahead = self._ahead
        if ahead is not None and (ahead.evicts or (held and ahead.blocks)):
            self._cut_run()

    # ---- requests -------------------------------------------------------------------------------

    def submit(self, input_tokens: int, output_tokens: int, hash_ids: Sequence[int] = (), trace_block: int = 0,
               tag: Any = None) -> simpy.Event:
        """Queue a request whose prompt's trace blocks of `trace_block` tokens have `hash_ids`; the
        returned event succeeds with its `Completion` when it ends. At least one output token is
        generated. The request reaches the waiting queue after its turn in the API server and the
        profile's `request_overhead` (its `submitted` time is now). Raises ValueError beyond
        `max_model_len`."""
        return self._submit(input_tokens, output_tokens, hash_ids, trace_block, tag, False)

    def submit_call(self, call: Call, tag: Any = None) -> simpy.Event:
        """`submit` a workload call, its prefix blocks keyed by its hash ids."""
        return self.submit(call.input_tokens, call.output_tokens, call.hash_ids, call.block_size, tag)

    def submit_call_raw(self, call: Call) -> simpy.Event:
        """`submit_call`, but the event's value is the twin's own `TwinRequest` instead of a
        `Completion`, to save building one: the SimPy driver builds its call record straight from it.
        It has the `Completion` figures under these names: `submitted`, `first_token`, `last_token`
        (the end), `prompt`, `generated`, `cached_tokens` (None is 0), `itl_count`, `itl_max`,
        `preemptions`, `gaps` (None unless kept)."""
        return self._submit(call.input_tokens, call.output_tokens, call.hash_ids, call.block_size, None, True)

    def _submit(self, input_tokens: int, output_tokens: int, hash_ids: Sequence[int], trace_block: int,
                tag: Any, raw: bool) -> simpy.Event:
        target = output_tokens if output_tokens > 1 else 1
        if input_tokens + target > self.max_model_len:
            raise ValueError(f"{input_tokens} + {target} tokens exceed max_model_len {self.max_model_len}")
        if self._ahead is not None:
            self._cut_run()  # before the API server takes the request
        event = simpy.Event(self.env)
        hold = self._holding_class(hash_ids, trace_block, input_tokens)
        req = TwinRequest(input_tokens, target, hold, self.env.now, event, tag, [] if self.keep_gaps else None, raw)
        delay = self.request_overhead
        busy = self.frontend_per_request + self.frontend_per_prompt_token * input_tokens
        if busy > 0.0 or self.frontend_per_output_token:
            # One request at a time, first come first served: wait for those before, then its own turn.
            now = self.env.now
            start = self._frontend_free if self._frontend_free > now else now
            self._frontend_free = start + busy
            delay += self._frontend_free - now
            if self.contention and busy > 0.0:
                self._intake.append((start, start + busy))
        if delay > 0.0:
            # Outside the engine: the request only waits, and the engine's next step boundary after it
            # sees the request.
            self.env.timeout(delay).callbacks.append(lambda _: self._enqueue(req))
        else:
            self._enqueue(req)
        return event

    def _enqueue(self, req: TwinRequest) -> None:
        """Put a request at the end of the waiting queue and wake an idle engine."""
        if self._ahead is not None:
            self._cut_run()
        self.waiting.append(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def in_flight(self) -> Iterator[tuple[Any, int]]:
        """(tag, output tokens generated so far) of every running request, oldest first, as of the
        last step processed (members of the decode group included, whose own counters lag)."""
        group = self.group
        if group.size:
            tokens = group.tokens + self._run_emitted()
            for req in group.members():
                yield req.tag, req.b + tokens
        for req in self.running:
            yield req.tag, req.generated

    def generated_in_flight(self) -> int:
        """Output tokens the running requests generated so far: the sum of `in_flight`'s counts."""
        group = self.group
        total = group.b_sum + group.size * (group.tokens + self._run_emitted()) if group.size else 0
        for req in self.running:
            total += req.generated
        return total

    def stats_now(self) -> TwinStats:
        """`stats` as stepping one by one has them now: with the steps that ended before now of a run of
        decode steps planned ahead (`_plans_ahead`), whose counters are otherwise added at its end."""
        steps = self._run_steps_ended()
        if not steps or self._ahead is None:
            return self.stats
        return replace(self.stats, steps=self.stats.steps + steps,
                       busy_time=self.stats.busy_time + self._ahead.ends[steps - 1] - self._plan[3])  # type: ignore[index]

    def _run_emitted(self) -> int:
        """Tokens each member of the decode group emitted in the steps of the run of decode steps under
        way that ended before now (0 outside a run): stepping one by one, they would have been applied."""
        steps = self._run_steps_ended()
        if not steps:
            return 0
        if self._ahead is None:
            chunk = self._plan[2]  # type: ignore[index]
            return chunk.emitted - chunk.last_emit
        return self._emitted_over(self._ahead.step_index, steps)

    def _run_steps_ended(self) -> int:
        """Steps of the run of decode steps under way that ended before now (0 outside a run, as it is
        planned, or once applied). A run ends at its first step ending at or after the next event, so
        every step of it but the last ends before any moment it is looked at; a run planned ahead keeps
        its step ends."""
        plan = self._plan
        if plan is None or plan[2] is None or self.env.now <= plan[3] or self.clock >= plan[4]:
            return 0
        if self._ahead is None:
            return plan[2].steps - 1
        return bisect_left(self._ahead.ends, self.env.now)

    def _emitted_over(self, step: int, steps: int) -> int:
        """Tokens each decoding sequence emits in engine steps `step` to `step + steps - 1`: emitted(g)
        telescopes (see `_steps_to_emit`)."""
        if not self.k:
            return steps
        return math.floor((step + steps) * self.rate) - math.floor(step * self.rate)

    def requests_ended(self) -> None:
        """Take note that requests ended just before the first one submitted here (a server in service):
        the engine's next step removes them from its batch (`batch_leave`)."""
        self._churn = self.batch_leave

    def fits(self, input_tokens: int, output_tokens: int) -> bool:
        """Whether a call of this size is accepted (prompt plus output within `max_model_len`)."""
        return input_tokens + max(1, output_tokens) <= self.max_model_len

    def planned_step(self) -> Optional[tuple[float, float]]:
        """(start, end) of the engine's latest planned step, None while it is idle. Stepping one by
        one (``fast_decode=False``) it is the step under way, or the one that ends now while the next
        is not planned yet; on the fast path it may be a run of decode steps."""
        plan = self._plan
        return None if plan is None else (plan[3], plan[4])

    def emitted(self, step: int) -> int:
        """Tokens each decoding sequence emits in engine step `step`."""
        if not self.k:
            return 1
        return math.floor((step + 1) * self.rate) - math.floor(step * self.rate)

    # ---- the engine -----------------------------------------------------------------------------

    def _start(self) -> Generator[simpy.Event, Any, None]:
        """The first step, run as a process: SimPy starts a process before the other events of its
        instant, so the engine begins stepping exactly where a process of its own would."""
        self._step()
        yield from ()

    def _step(self, _event: Optional[simpy.Event] = None) -> None:
        """Plan the next step and schedule its end, or wait idle for a request."""
        group = self.group
        if not self.running and not self.waiting and not group.size:
            self._plan = None
            self._charged = None
            self._idle_since = self.clock
            wake = self._wake = simpy.Event(self.env)
            wake.callbacks.append(self._woken)
            return
        decodes, prefills, preempted = self._schedule()
        if not decodes and not prefills and not group.size:
            raise RuntimeError("twin: requests wait but none can be scheduled (KV cache too small?)")
        env = self.env
        now = env.now
        start = self.clock
        chunk = None
        if group.size and not prefills and not decodes and not preempted and not self.running \
                and env.peek() > now and (not self.per_new_shape or group.size * (1 + self.k) in self._shapes) \
                and not self._churn and not (self._intake and self._pending_intake(start)):
            chunk = self._decode_chunk()
        if chunk is None:
            duration = self._duration(decodes, prefills)
            if start < self._warm_at:
                duration *= self.slow
            if self.contention:
                duration += self._stolen(start, duration)
            end = start + duration + self._cold + self._churn
            self._cold = 0.0
            self._churn = 0.0
            if self.per_new_shape:
                tokens = sum(n for _, n in prefills) + (len(decodes) + group.size) * (1 + self.k)
                if not self._known_shape(tokens):
                    end += self.per_new_shape
        else:
            end = chunk.end
            self._known_shape(group.size * (1 + self.k))  # a run of steps of one known size
            if self.contention:
                self._charged = (start, 0.0)
        step: _Step = (decodes, prefills, chunk, start, end)
        self._plan = step
        timeout = env.timeout(exact_delay(now, end), step)
        timeout.callbacks.append(self._step_done)
        if self._ahead is not None:
            self._ahead.timeout = timeout

    def _pending_intake(self, start: float) -> deque[tuple[float, float]]:
        """The API server's intake work that a step planned at `start` may pay for (`_stolen`): what
        ends after the step under way began (after `start` following an idle); older work is dropped.
        A step with any is planned on its own, not in a run of decode steps."""
        intake = self._intake
        since = start if self._charged is None else self._charged[0]
        while intake and intake[0][1] <= since:
            intake.popleft()
        return intake

    def _stolen(self, start: float, duration: float) -> float:
        """Engine time the API server's intake work takes from the step planned at `start` for
        `duration` (`frontend_contention`): its share of the work inside the step as planned, plus
        that of the work inside the step before it beyond what that step was charged (requests that
        arrived after it was planned)."""
        intake = self._pending_intake(start)
        before = self._charged
        since = start if before is None else before[0]
        late = 0.0
        now = 0.0
        end = start + duration
        for begin, finish in intake:
            if before is not None and begin < start:
                late += (finish if finish < start else start) - (begin if begin > since else since)
            if finish > start and begin < end:
                now += (finish if finish < end else end) - (begin if begin > start else start)
        now *= self.contention
        late = late * self.contention - before[1] if before is not None else 0.0
        self._charged = (start, now)
        return now + late if late > 0.0 else now

    def _known_shape(self, tokens: int) -> bool:
        """Whether a step of `tokens` scheduled tokens finds its kernels built (always, without
        `per_new_shape`); either way they are the most recently used from now on."""
        if not self.per_new_shape:
            return True
        shapes = self._shapes
        if tokens in shapes:
            shapes.move_to_end(tokens)
            return True
        shapes[tokens] = None
        if len(shapes) > self.shape_cache:
            shapes.popitem(last=False)
        return False

    def _woken(self, _event: simpy.Event) -> None:
        self._wake = None
        self.clock = self.env.now
        if self.clock - self._idle_since > self.idle_after:
            self._cold = self.idle_wake
            self._warm_at = self.clock + self.wake_period
        self._step()

    def _step_done(self, event: simpy.Event) -> None:
        """Apply the step that ends now (the value of `event`, its end), then plan the next one."""
        step: _Step = event.value
        decodes, prefills, chunk, start, end = step
        ahead = self._ahead
        if ahead is not None:  # a run planned ahead ends uncut
            self._ahead = None
            self._end_ahead(ahead)
        if chunk is None:
            finished = self._finish_step(decodes, prefills, end)
        else:
            finished = self._finish_chunk(chunk)
        self.stats.busy_time += self.clock - start
        if finished:  # requests ended, and their clients learn it now
            # Let the clients of finished requests react (send their next call) before the next
            # step is planned, as a server sees a request sent the instant another ended.
            self.env.timeout(0).callbacks.append(self._step)
        else:
            self._step()

    def _schedule(self) -> tuple[list[TwinRequest], list[tuple[TwinRequest, int]], bool]:
        """Pick this step's work: (decoding requests outside the group, (request, chunk) prefills,
        whether any preemption). The group's members all decode."""
        budget = self.budget
        per_decode = 1 + self.k
        group = self.group
        if group.size:
            # The members come first in the running order, and their blocks are private: the cache
            # grants their growth as a whole exactly when it grants it member by member.
            need = group.blocks_needed(group.tokens + per_decode)
            tokens = group.size * per_decode
            if tokens <= budget and (not need or self._group_takes(need)):
                budget -= tokens
            else:
                self.running[:0] = group.settle_all()  # step them one by one (skips, preemptions)
                self.stats.settled_steps += 1
        group.horizon = group.tokens + per_decode
        if self._unkeyed:
            self._key_members(group.horizon)
        running = self.running
        decodes: list[TwinRequest] = []
        prefills: list[tuple[TwinRequest, int]] = []
        preempted = False
        # Preemption pops from the end of `running`, past the request at hand: iteration stays valid.
        for req in running:
            if not budget:
                break  # nothing after gets a token: decoders are skipped, prefills get no chunk
            if req.decoding:
                n = per_decode
                if budget < n:
                    continue
            else:
                n = req.prefill_len - req.computed
                if n > budget:
                    n = budget
                if n <= 0:
                    continue
                n = self._prefill_chunk(req, n)
                if n <= 0:
                    continue
            tokens = req.computed + n
            if not self._grow(req, tokens):
                preempted = True
                if not self._make_room(req, tokens):
                    break
            budget -= n
            if req.decoding:
                decodes.append(req)
            else:
                prefills.append((req, n))
        if not preempted and self.waiting:
            self._admit(budget, prefills)
        if decodes and self.fast_decode:
            decodes = self._join(decodes)
        total = len(self.running) + group.size
        if total > self.stats.max_running:
            self.stats.max_running = total
        return decodes, prefills, preempted

    def _join(self, decodes: list[TwinRequest]) -> list[TwinRequest]:
        """Move the scheduled decoders at the head of `running` into the group, as far as their blocks
        are only private ones from now on; returns those left out."""
        running, group = self.running, self.group
        k = 0
        for req in decodes:
            if k >= len(running) or running[k] is not req or not self._may_join(req):
                break
            group.join(req)
            if self._keys_in_group and self.kv.prefix_caching and req.hold.keyed_tb < len(req.hold.ids):
                self._unkeyed.append(req)
                self._unkeyed_joined = True
            k += 1
        if k:
            del running[:k]
        return decodes[k:]

    def _key_members(self, horizon: int) -> None:
        """Key what the tree now lets members key of their prompts (see `_keys_in_group`), in running
        order, as stepping them one by one would at this step: each holds `a + horizon` tokens then."""
        if self._unkeyed_joined:  # put the newcomers in running order (a member that came back is there twice)
            members = sorted({id(r): r for r in self._unkeyed if r.in_group}.values(), key=attrgetter("seq"))
            self._unkeyed_joined = False
        else:
            members = [r for r in self._unkeyed if r.in_group]
        left = []
        kv = self.kv
        tried = self._keying_tried
        for req in members:
            hold = req.hold
            tokens = req.a + horizon
            if tokens // hold.tb > hold.keyed_tb:
                state = kv.keying_state(hold)
                if tried.get(req) != state:  # else the same tree as last time: no more keyed
                    kv._grow(hold, tokens)
                    req.keyed = hold.blocks - hold.private
                    tried[req] = kv.keying_state(hold) if hold.keyed_tb < len(hold.ids) else None
            if hold.keyed_tb < len(hold.ids):
                left.append(req)
        self._unkeyed = left
        if len(tried) > 2 * len(left) + 64:
            self._keying_tried = {req: tried[req] for req in left if req in tried}

    def _admit(self, budget: int, prefills: list[tuple[TwinRequest, int]]) -> None:
        """Admit waiting requests first come first served while seats, budget and blocks allow."""
        running, waiting = self.running, self.waiting
        seats = self.max_num_seqs - self.group.size
        while waiting and budget > 0 and len(running) < seats:
            req = waiting[0]
            tokens = req.prompt + req.generated
            hit = self._hit(req, tokens)
            if hit is None:
                break
            match, computed = hit
            n = tokens - computed
            if n > budget:
                if not self.chunked:
                    break
                n = budget
            n = self._admit_blocks(req, match, tokens, computed, n)
            if not n:
                break
            waiting.popleft()
            if req.cached_tokens is None:
                req.cached_tokens = computed
                self.stats.cached_tokens += computed
                self.stats.queried_tokens += tokens
            req.computed = computed
            req.prefill_len = tokens
            req.decoding = False
            self._admitted += 1
            req.seq = self._admitted
            running.append(req)
            prefills.append((req, n))
            budget -= n

    def _make_room(self, req: TwinRequest, tokens: int) -> bool:
        """Preempt the newest running requests until `req` can hold `tokens`; False if `req` itself
        had to go."""
        while True:
            victim = self.running.pop()
            self._preempt(victim)
            if victim is req:
                return False
            if self._grow(req, tokens):
                return True

    def _preempt(self, req: TwinRequest) -> None:
        """Free a running request's blocks and put it back at the front of the waiting queue."""
        self.kv.release(req.hold, req.computed)
        req.computed = 0
        req.decoding = False
        req.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def _duration(self, decodes: list[TwinRequest], prefills: list[tuple[TwinRequest, int]]) -> float:
        per_decode = 1 + self.k
        group = self.group
        context = len(decodes) * per_decode + group.context(per_decode)
        for req in decodes:
            context += req.computed
        decode_context = context
        prefill_tokens = 0
        pairs = 0
        for req, n in prefills:
            prefill_tokens += n
            context += req.computed + n
            pairs += n * req.computed + n * (n + 1) // 2
        return self.model.duration(prefill_tokens, len(prefills), len(decodes) + group.size, context, pairs,
                                   decode_context)

    def _finish_step(self, decodes: list[TwinRequest], prefills: list[tuple[TwinRequest, int]], end: float) -> bool:
        """Apply one step's results at its end time; True when requests' events were resolved now."""
        self.clock = end
        emit = self.emitted(self._step_index) if self.k else 1
        self._step_index += 1
        self.stats.steps += 1
        if self.frontend_per_output_token:
            end = self._deliver(self._step_tokens(decodes, prefills, emit), end)  # the tokens' time from here
        done = self.group.advance(1, end, end, 0.0, (), emit) if self.group.size else []
        group_done = len(done)
        for req in decodes:
            n = req.target - req.generated
            if emit < n:
                n = emit
            req.generated += n
            req.computed += n
            gap = end - req.last_token
            req.itl_count += 1
            if gap > req.itl_max:
                req.itl_max = gap
            if req.gaps is not None:
                req.gaps.append(gap)
            req.last_token = end
            if req.generated >= req.target:
                done.append(req)
        joined = False
        for req, n in prefills:
            req.computed += n
            self.stats.prefill_tokens += n
            if req.computed >= req.prefill_len:
                req.generated += 1
                req.decoding = True
                if req.generated < req.target:
                    joined = True
                if req.first_token is None:
                    req.first_token = end
                    req.last_token = end
                else:
                    self._token(req, end)
                if req.generated >= req.target:
                    done.append(req)
        if joined:
            self._churn += self.batch_join
        return self._finish(done, group_done, end) if done else False

    def _step_tokens(self, decodes: list[TwinRequest], prefills: list[tuple[TwinRequest, int]], emit: int) -> int:
        """Tokens a step emits (before its results are applied): `emit` for each decoding sequence, or
        what it lacks of its target, and one for each prefill it completes."""
        group = self.group
        tokens = group.emitted_tokens(group.tokens, emit) if group.size else 0
        for req in decodes:
            n = req.target - req.generated
            tokens += emit if emit < n else n
        for req, n in prefills:
            if req.computed + n >= req.prefill_len:
                tokens += 1
        return tokens

    def _deliver(self, tokens: int, t: float) -> float:
        """Hand the API server `tokens` tokens a step emitted at `t`: when it has sent them (it works
        first come first served, `frontend_per_output_token` a token)."""
        if not tokens:
            return t
        free = self._frontend_free
        free = (free if free > t else t) + tokens * self.frontend_per_output_token
        self._frontend_free = free
        return free

    def _token(self, req: TwinRequest, t: float) -> None:
        gap = t - req.last_token
        req.itl_count += 1
        if gap > req.itl_max:
            req.itl_max = gap
        if req.gaps is not None:
            req.gaps.append(gap)
        req.last_token = t

    def _decode_chunk(self, alone: bool = False) -> Optional[_Chunk]:
        """Plan as many pure-decode steps of the group as can run before anything changes; None when
        only one may. `alone`: only up to the next event, even for a twin that plans ahead."""
        group = self.group
        n_seqs = group.size
        k = self.k
        remaining = group.remaining()
        horizon = self.env.peek()
        step = self._step_index
        terms = self._decode_terms.get(n_seqs)
        if terms is None:
            terms = self._decode_terms[n_seqs] = self.model.decode_terms(n_seqs)
        base, add, floor = terms
        per_context = self.model.per_context_token
        start_context = context = group.context(1 + k)
        # A step lasts max(compute + add, floor) (see `StepTimeModel.decode_terms`). The first step
        # comes before the loop: its gap is each member's own, not one of the run's inner gaps.
        compute = base + per_context * context + add
        warm_at, slow = self._warm_at, self.slow
        duration = compute if compute > floor else floor
        if self.clock < warm_at:
            duration *= slow
        t = first = self.clock + duration
        emit = self.emitted(step) if k else 1
        ahead = False
        if self._plans_ahead and not alone:
            later = self._horizon_ahead(duration)
            if later > horizon:
                horizon, ahead = later, True
        if emit >= remaining or first >= horizon:
            return None
        context += n_seqs * emit
        limit = self._steps_to_emit(step + 1, remaining - emit) if k else remaining - emit
        if limit > MAX_CHUNK_STEPS - 1:
            limit = MAX_CHUNK_STEPS - 1
        if self._limits_chunks:
            limit = self._chunk_limit(step, emit, limit)
        emits = map(self.emitted, range(step + 1, step + 1 + limit)) if k else repeat(1, limit)
        gaps: Optional[list[float]] = None
        ends: Optional[list[float]] = None
        inner_max = 0.0
        if (self.frontend_per_output_token or ahead) and t >= warm_at:
            # The step ends are kept, and the gaps set from them later: by `_deliver_inner` (between
            # deliveries), or when a run planned ahead ends or is cut (`_run_gaps`).
            ends = [first]
            append = ends.append
            for emit in emits:  # as below
                compute = base + per_context * context + add
                t = t + (compute if compute > floor else floor)
                append(t)
                context += n_seqs * emit
                if t >= horizon:
                    break
            steps = len(ends)
        else:
            gaps = [] if self.keep_gaps else None
            if self.frontend_per_output_token or ahead:
                ends = [first]  # to deliver the tokens of the steps, or to cut a run planned ahead
            steps = 1
            for emit in emits:  # until the first to reach a target, or to end at or after the horizon
                compute = base + per_context * context + add
                before = t
                duration = compute if compute > floor else floor
                if before < warm_at:
                    duration *= slow
                t = t + duration
                gap = t - before
                if gap > inner_max:
                    inner_max = gap
                if gaps is not None:
                    gaps.append(gap)
                if ends is not None:
                    ends.append(t)
                context += n_seqs * emit
                steps += 1
                if t >= horizon:
                    break
        emitted = (context - start_context) // n_seqs
        # Blocks for the last step (which emitted `emit`) must fit without preemption, else step one by one.
        reach = group.tokens + emitted - emit + 1 + k
        need = group.blocks_needed(reach)
        kv = self.kv
        if ahead:  # the blocks are taken at the run's end or cut (`_cut_run`); here only whether they can be
            if need > kv.available:
                return self._decode_chunk(True)
            free = self._frontend_free
        elif not kv.take(need):
            return None
        group.horizon = reach
        chunk = _Chunk(steps, first, t, inner_max, gaps if gaps is not None else (), emitted, emit)
        if self.frontend_per_output_token:
            assert ends is not None
            self._deliver_inner(chunk, ends, n_seqs)
        if ahead:
            assert ends is not None
            self._ahead = _AheadRun(chunk, ends, step, need, need > kv.fresh - kv.prepaid, free)
        return chunk

    def _cut_run(self) -> None:
        """Work reaches the twin now, inside a run of decode steps planned ahead (`_plans_ahead`): the
        run ends at its first step boundary at or after now instead, where it would have ended had now
        been the next event when it was planned; its KV blocks are taken now. The run's step end times
        were kept, so it is cut without being planned again."""
        ahead = self._ahead
        assert ahead is not None
        self._ahead = None
        ends = ahead.ends
        last = bisect_left(ends, self.env.now)  # the cut run's last step
        kv = self.kv
        if last >= len(ends) - 1:  # it ends as planned (maybe now, its end not handled yet)
            self._end_ahead(ahead)
            return
        group, k = self.group, self.k
        group.horizon = group.tokens + 1 + k  # the first step's blocks, taken when it was scheduled
        if self.frontend_per_output_token:
            self._frontend_free = ahead.frontend_free  # its deliveries are handed over again below
        start = self._plan[3]  # type: ignore[index]
        if not last:  # its first step alone, as the twin plans one step
            step: _Step = ([], [], None, start, ends[0])
        else:
            chunk = ahead.chunk
            steps = last + 1
            first_step = ahead.step_index
            emitted, last_emit = self._emitted_over(first_step, steps), self.emitted(first_step + last)
            chunk.steps, chunk.end, chunk.emitted, chunk.last_emit = steps, ends[last], emitted, last_emit
            if self.frontend_per_output_token:
                self._deliver_inner(chunk, ends, group.size)
            else:
                self._run_gaps(chunk, ends)
            reach = group.tokens + emitted - last_emit + 1 + k
            taken = kv.take(group.blocks_needed(reach))
            assert taken, "blocks checked when the run was planned"
            group.horizon = reach
            step = ([], [], chunk, start, ends[last])
        self._plan = step
        assert ahead.timeout is not None
        ahead.timeout.callbacks.clear()  # cancelled: its end is not the run's any more
        env = self.env
        env.timeout(exact_delay(env.now, step[4]), step).callbacks.append(self._step_done)

    def _end_ahead(self, ahead: _AheadRun) -> None:
        """A run planned ahead ends as planned: take its KV blocks now (nothing else touched the cache
        since it was planned) and set its gaps, unless `_deliver_inner` did."""
        taken = self.kv.take(ahead.blocks)
        assert taken, "blocks checked when the run was planned"
        if not self.frontend_per_output_token:
            self._run_gaps(ahead.chunk, ahead.ends)

    def _run_gaps(self, chunk: _Chunk, ends: list[float]) -> None:
        """Set the gaps of a run of `chunk.steps` decode steps from its step ends (`ends`, the first
        ones), for a run planned ahead (or cut short)."""
        gaps: Optional[list[float]] = [] if self.keep_gaps else None
        inner_max = 0.0
        before = ends[0]
        for t in islice(ends, 1, chunk.steps):
            gap = t - before
            if gap > inner_max:
                inner_max = gap
            if gaps is not None:
                gaps.append(gap)
            before = t
        chunk.inner_max = inner_max
        chunk.inner_gaps = gaps if gaps is not None else ()

    def _deliver_inner(self, chunk: _Chunk, ends: list[float], n_seqs: int) -> None:
        """Hand the API server the tokens of a run's steps but the last (ending at `ends`), as their
        ends would one by one, and set the run's gaps to those between their deliveries."""
        count = chunk.steps - 1
        if not count:
            chunk.delivered_before_last = chunk.inner_max = 0.0
            chunk.inner_gaps = [] if self.keep_gaps else ()
            return
        # `_deliver` written out (every step emits tokens)
        per_token = self.frontend_per_output_token
        step, k = self._step_index, self.k
        work = n_seqs * per_token
        gaps: Optional[list[float]] = [] if self.keep_gaps else None
        inner_max = 0.0
        free = self._frontend_free
        end = ends[0]
        free = before = (free if free > end else end) + (n_seqs * self.emitted(step) * per_token if k else work)
        chunk.delivered_first = free
        for i in range(1, count):
            end = ends[i]
            free = (free if free > end else end) + (n_seqs * self.emitted(step + i) * per_token if k else work)
            gap = free - before
            if gap > inner_max:
                inner_max = gap
            if gaps is not None:
                gaps.append(gap)
            before = free
        self._frontend_free = free
        chunk.delivered_before_last = free
        chunk.inner_max = inner_max
        chunk.inner_gaps = gaps if gaps is not None else ()

    def _chunk_limit(self, step: int, first_emit: int, limit: int) -> int:
        """Steps after the first a run of decode steps from engine step `step` may take (hybrid
        models stop before a boundary crossing)."""
        return limit

    def _steps_to_emit(self, step: int, tokens: int) -> int:
        """The fewest steps from engine step `step` in which each decoding sequence emits `tokens`
        (with speculative decoding)."""
        # emitted(g) telescopes: steps step..step+n-1 emit floor((step+n) r) - floor(step r)
        rate = self.rate
        before = math.floor(step * rate)
        n = max(1, int(tokens / rate))
        while math.floor((step + n) * rate) - before < tokens:
            n += 1
        while n > 1 and math.floor((step + n - 1) * rate) - before >= tokens:
            n -= 1
        return n

    def _finish_chunk(self, chunk: _Chunk) -> bool:
        """Apply a run of the group's pure-decode steps at its end time; True when requests' events were
        resolved now."""
        self.clock = chunk.end
        self._step_index += chunk.steps
        self.stats.steps += chunk.steps
        self.stats.fast_chunks += 1
        group = self.group
        first, end, inner_max, inner = chunk.first, chunk.end, chunk.inner_max, chunk.inner_gaps
        if self.frontend_per_output_token:
            last = group.emitted_tokens(group.tokens + chunk.emitted - chunk.last_emit, chunk.last_emit)
            end = self._deliver(last, end)
            if chunk.steps == 1:
                first = end
            else:
                first = chunk.delivered_first
                gap = end - chunk.delivered_before_last
                if gap > inner_max:
                    inner_max = gap
                if self.keep_gaps:
                    inner = [*inner, gap]
        done = group.advance(chunk.steps, first, end, inner_max, inner, chunk.emitted)
        return self._finish(done, len(done), end) if done else False

    def _finish(self, done: list[TwinRequest], settled: int, end: float) -> bool:
        """End finished requests (the first `settled` were group members, already out of `running`):
        free their blocks now, resolve their events at `end`, when their last tokens reach the clients.
        True when the events were resolved now."""
        if settled < len(done):
            finished = set(map(id, done[settled:]))
            self.running = [r for r in self.running if id(r) not in finished]
        self._churn += self.batch_leave
        stats = self.stats
        for req in done:
            self.kv.release(req.hold, req.computed)
            stats.finished += 1
            stats.output_tokens += req.generated
        now = self.env.now
        if end > now:  # the API server is still sending: the clients learn of the end later
            self.env.timeout(exact_delay(now, end)).callbacks.append(lambda _: self._resolve(done, end))
            return False
        self._resolve(done, end)
        return True

    def _resolve(self, done: list[TwinRequest], end: float) -> None:
        """Resolve ended requests' events."""
        for req in done:
            event = req.event
            assert event is not None
            if req.raw:
                req.event = None  # the event's value is the request: no cycle left
                event.succeed(req)
                continue
            count = req.itl_count
            first = req.first_token
            event.succeed(Completion(
                submitted=req.submitted,
                first_token=first,
                end=end,
                input_tokens=req.prompt,
                output_tokens=req.generated,
                cached_tokens=req.cached_tokens or 0,
                itl_count=count,
                itl_mean=(req.last_token - first) / count if count and first is not None else None,
                itl_max=req.itl_max if count else None,
                preemptions=req.preemptions,
                gaps=req.gaps if req.gaps is not None else [],
                tag=req.tag,
            ))


def exact_delay(now: float, t: float) -> float:
    """A delay that brings SimPy's clock from `now` to exactly `t` (now + (t - now) can round off)."""
    delay = t - now
    if now + delay != t:
        while now + delay < t:
            delay = math.nextafter(delay, math.inf)
        while now + delay > t:
            delay = math.nextafter(delay, -math.inf)
    return delay if delay > 0.0 else 0.0
