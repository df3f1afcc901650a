"""The SimPy driver: runs the agent behaviour of every task in simulated time against the twin.

The same protocol as the live driver (`simulator.live.driver`), on the SimPy clock: each top-level task
starts at its arrival (open loop across tasks), `Wait` is a timeout, `Send` submits to the twin and
resumes at the response's end, `Fork` starts sub-tasks as their own tasks (`TaskRecord.parent_id` set)
and resumes when those with ``wait=True`` have finished; a task ends when it and its sub-tasks have.
Both consume the behaviour through `simulator.task_run.TaskRun`, so they leave the same
`CallRecord`/`TaskRecord` for the same events. Simulation has no client lag of its own: a call is
sent exactly when intended unless `max_in_flight` holds its task back (the server's own per-request
time is the profile's `request_overhead`, inside the twin). Calls longer than the profile's `max_model_len` fail at once
with ``http_4xx`` (status 400), as vLLM rejects them.

With `scrape_interval`, the driver also plays a live run's /metrics probe: a SimPy process samples the
twin every that many simulated seconds (`simulator.sim.scrape`), from 0 on a fixed grid, plus once when
the last task ends (or at the drain deadline), and hands each sample to `on_scrape`. Its timeouts are
events like any other, so the twin's runs of decode steps stop at them; the records stay the same.

A fleet (`simulator.fleet.twin.FleetTwin`, the `server` argument) takes the twin's place: each call is
sent with its session key to the fleet's router model, and its record names the replica that served it.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, Union

import simpy

from ..behaviour import CallRequest, Fork, RetryPolicy, Send, Wait
from ..metrics.records import CallRecord, TaskRecord
from ..task_run import DriverResult, RecordSink, TaskRun, call_record, failed_call
from ..workload import Task, Workload
from .profile import ServerProfile
from .request import TwinRequest
from .make_twin import make_twin
from .scrape import TwinScraper
from .twin import TwinStats, exact_delay

ScrapeSink = Callable[[float, dict[str, float]], None]
"""Takes one sample of the twin's /metrics: (simulated seconds, values by the probe's names)."""


@dataclass
class ListSink:
    """A sink that keeps every record in memory (gaps per call too, when the twin keeps them)."""

    calls: list[CallRecord] = field(default_factory=list)
    gaps: list[Sequence[float]] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None:
        self.calls.append(record)
        self.gaps.append(gaps)

    def task(self, record: TaskRecord) -> None:
        self.tasks.append(record)


class RoutedServer(Protocol):
    """A server of several replicas behind a router, in the driver's environment (`simulator.fleet.twin.FleetTwin`):
    a call is submitted with its session key and comes back with the name of the replica that served it."""

    max_model_len: int
    sub_agents: str
    """Whose key a sub-agent's calls carry: ``parent`` or ``own`` (`CallRequest.session_key`)."""

    @property
    def stats(self) -> TwinStats: ...

    def submit_call_raw(self, call: Any, key: str) -> tuple[simpy.Event, str]: ...

    def scraper(self) -> Any: ...


@dataclass
class SimResult(DriverResult):
    """How a simulated run ended, with the twin's counters."""

    twin: TwinStats = field(default_factory=TwinStats)


class SimDriver:
    """Replays a workload through a `Twin` in simulated time; records go to `sink` as they finish.

    `workload` may also be an iterable of tasks in arrival order (a generator, say): tasks are then
    drawn only as they arrive, so memory holds the tasks in flight rather than the whole run.
    `max_in_flight` and `drain` mean what they mean live: at most that many top-level tasks run at once
    (a task waiting for its turn shows the wait as client lag), and `drain` seconds after the last
    arrival whatever still runs is cut off, recorded as ``cancelled``. With `scrape_interval` (seconds,
    > 0), `on_scrape` gets a sample of the twin's /metrics every that many simulated seconds (see the
    module docstring). `server`, given the driver's SimPy environment, builds what serves the calls
    instead of the twin of `profile`: a fleet of replica twins behind a router (`RoutedServer`), to
    which each call goes with its session key, and whose records name the replica that served them."""

    def __init__(self, workload: Union[Workload, Iterable[Task]], profile: ServerProfile, sink: RecordSink, *,
                 retry: RetryPolicy = RetryPolicy(), keep_gaps: bool = False, fast_decode: bool = True,
                 duration: Optional[float] = None, max_in_flight: Optional[int] = None,
                 drain: Optional[float] = None, scrape_interval: Optional[float] = None,
                 on_scrape: Optional[ScrapeSink] = None,
                 server: Optional[Callable[[simpy.Environment], RoutedServer]] = None) -> None:
        self.env = simpy.Environment()
        self.fleet: Optional[RoutedServer] = server(self.env) if server is not None else None
        # sampling /metrics, the twin plans its runs past the samples: the events that bring it no work
        self.twin: Any = (self.fleet if self.fleet is not None
                          else make_twin(self.env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode,
                                         plan_ahead=scrape_interval is not None))
        self.total: Optional[int] = None
        if isinstance(workload, Workload):
            self.tasks: Iterable[Task] = sorted(workload.tasks, key=lambda t: t.arrival)
            self.total = len(workload.tasks)
        else:
            self.tasks = workload
        self.sink = sink
        self.retry = retry
        self.duration = duration
        """Tasks arriving at or after this many seconds are not started."""
        self.drain = drain
        self._gate = simpy.Resource(self.env, max_in_flight) if max_in_flight else None
        self.started = 0
        self._last_end = 0.0
        self._active: dict[TaskRun, None] = {}
        """Tasks started and not finished, in start order (a dict as an ordered set)."""
        self._arrived = False
        """Every task that will start has started."""
        if scrape_interval is not None and not scrape_interval > 0:
            raise ValueError(f"scrape_interval must be > 0, not {scrape_interval}")
        if (scrape_interval is None) != (on_scrape is None):
            raise ValueError("scrape_interval and on_scrape go together")
        self.scrape_interval = scrape_interval
        self._on_scrape = on_scrape
        self.scraper = (None if self.scrape_interval is None else TwinScraper(self.twin) if self.fleet is None
                        else self.fleet.scraper())
        self._last_scrape: Optional[float] = None
        """Time of the latest sample; None before the first."""
        self._scraping_over = False

    def run(self) -> SimResult:
        """Run every task to its end (or to the drain deadline); returns how it ended."""
        arrivals = self.env.process(self._arrivals())
        if self.scraper is not None:
            self.env.process(self._scraping())
        with _fewer_collections():
            self.env.run(until=arrivals if self.drain is not None else None)
        stop_reason = "completed"
        if self._active:
            stop_reason = "drain_timeout"
            self._cut_off(self.env.now)
        self._last_sample()
        not_started = None if self.total is None else self.total - self.started
        return SimResult(stop_reason, self.started, not_started, self._last_end, self.twin.stats)

    def _arrivals(self):
        """Starts each top-level task at its arrival; with `drain`, ends that long after the last one."""
        env = self.env
        for task in self.tasks:
            if self.duration is not None and task.arrival >= self.duration:
                break
            if task.arrival < env.now:
                raise ValueError(f"task {task.id} arrives at {task.arrival} s, before the previous task")
            if task.arrival > env.now:
                yield env.timeout(exact_delay(env.now, task.arrival))
            self.started += 1
            self._start(TaskRun(task, task.arrival, self.retry))
        self._arrived = True
        if self.drain is not None:
            yield env.timeout(self.drain)

    def _start(self, run: TaskRun) -> simpy.Process:
        self._active[run] = None
        if self._gate is not None and run.parent is None:
            return self.env.process(self._gated(run))
        return self.env.process(self._task(run))

    def _gated(self, run: TaskRun):
        """A top-level task that first waits for one of the `max_in_flight` places."""
        with self._gate.request() as place:  # type: ignore[union-attr]
            yield place
            yield from self._task(run)

    def _task(self, run: TaskRun):
        """Process carrying out one task's effects in simulated time; its value is the task's outcome."""
        env = self.env
        twin = self.twin
        fleet = self.fleet
        scraper = self.scraper
        max_model_len = twin.max_model_len
        children: list[simpy.Process] = []
        value: Any = None
        while (effect := run.next_effect(value)) is not None:
            if isinstance(effect, Send):
                request = effect.request
                call = request.call
                now = env.now
                run.sending(request, now)
                if call.input_tokens + max(1, call.output_tokens) <= max_model_len:  # Twin.fits, inlined
                    if fleet is None:
                        replica = None
                        done = yield twin.submit_call_raw(call)  # the twin's request: see Twin.submit_call_raw
                    else:
                        routed, replica = fleet.submit_call_raw(call, request.session_key(fleet.sub_agents))
                        done = yield routed
                    if scraper is not None:
                        scraper.ended(done)
                    record = _served(request, run.anchor, now, done, replica)
                    self.sink.call(record, done.gaps if done.gaps is not None else ())
                else:
                    record = self._rejected(request, run.anchor, now)
                value = run.called(record)
            elif isinstance(effect, Wait):
                value = None
                until = run.wait(effect.seconds)
                if until > env.now:
                    yield env.timeout(exact_delay(env.now, until))
            elif isinstance(effect, Fork):
                waited = []
                for sub in effect.subtasks:
                    child = self._start(TaskRun(sub.task, env.now, self.retry, run))
                    children.append(child)
                    if sub.wait:
                        waited.append(child)
                if waited:
                    yield env.all_of(waited)
                value = [child.value for child in waited]
                run.forked(env.now)
            else:
                raise TypeError(f"unknown effect {effect!r}")
        for child in children:
            if not child.triggered:
                yield child
        self._end(run, run.finish(env.now))
        return run.outcome

    def _end(self, run: TaskRun, record: TaskRecord) -> None:
        del self._active[run]
        if record.end > self._last_end:
            self._last_end = record.end
        self.sink.task(record)
        if self._arrived and not self._active:
            self._last_sample()

    def _scraping(self):
        """Process sampling the twin's /metrics at 0, interval, 2 interval, ... until the run is over."""
        env = self.env
        interval = self.scrape_interval
        assert interval is not None
        tick = 0
        while not self._scraping_over:
            if self._arrived and not self._active:
                self._last_sample()  # `_end` took it already, unless no task ever started
                return
            self._sample()
            tick += 1
            yield env.timeout(exact_delay(env.now, tick * interval))

    def _sample(self) -> None:
        now = self.env.now
        if now != self._last_scrape:
            self._last_scrape = now
            self._on_scrape(float(now), self.scraper.sample())  # type: ignore[misc,union-attr]

    def _last_sample(self) -> None:
        """The run is over (every task ended, or cut off): one last sample now, and no more."""
        if self.scraper is not None and not self._scraping_over:
            self._sample()
            self._scraping_over = True

    def _cut_off(self, now: float) -> None:
        """At the drain deadline: record the calls in flight and the unfinished tasks as cancelled,
        sub-tasks before their parents (as live, where a cancelled parent waits for its children)."""
        for run in reversed(list(self._active)):
            if (record := run.cancel(now)) is not None:
                self.sink.call(record)
            self._end(run, run.finish(now, cancelled=True))

    def _rejected(self, request: CallRequest, intended: float, sent: float) -> CallRecord:
        """The record of a call longer than `max_model_len`, failed at once as vLLM fails it (HTTP 400)."""
        call = request.call
        record = failed_call(
            request, intended, sent, sent, "http_4xx",
            f"prompt + output ({call.input_tokens} + {call.output_tokens}) exceeds max_model_len "
            f"{self.twin.max_model_len}", status=400)
        self.sink.call(record)
        return record


def _served(request: CallRequest, intended: float, sent: float, done: TwinRequest,
            replica: Optional[str] = None) -> CallRecord:
    """The record of a call the twin served (`done` is the twin's request record; `replica` the fleet's
    replica that served it)."""
    end = done.last_token
    first = done.first_token
    count = done.itl_count
    return call_record(
        request, intended, sent, end, ttft=first - sent, itl_count=count,
        itl_mean=(end - first) / count if count else None, itl_max=done.itl_max if count else None,
        output_tokens=done.generated, cached_tokens=done.cached_tokens or 0, status=200, replica=replica)


@contextmanager
def _fewer_collections():
    """Run the cyclic garbage collector less often: a run allocates a few dozen objects a call, nearly
    all freed by reference counting, and the default thresholds would collect every few dozen calls
    while the prefix cache keeps millions of objects alive (about a tenth of a long run)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], 100_000), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def simulate(workload: Workload, profile: ServerProfile, **options: Any) -> tuple[ListSink, SimResult]:
    """Run a workload on a twin of `profile`, keeping every record in memory; `options` are
    `SimDriver`'s (retry, keep_gaps, max_in_flight, ...)."""
    sink = ListSink()
    return sink, SimDriver(workload, profile, sink, **options).run()
