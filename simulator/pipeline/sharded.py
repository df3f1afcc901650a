"""One live run over many shards on Ray (`agentload run SCENARIO --ray [ADDRESS]`), end to end.

The run's own process (the driver here) does what a single-process run does before and after the
replay: checks the target (preflight), starts the built-in emulator when the scenario has no target,
scrapes the server's /metrics, writes run.json and, at the end, the summary. The replay itself is
spread over `Shard` actors (`simulator.scale.shard`), one per shard, each taking whole tasks dealt
round-robin by arrival (`simulator.scale.plan`):

1. the actors set up (client, bodies of the first arrivals) and report ready: a barrier;
2. the driver picks t0 = now + `START_MARGIN` on the wall clock and sends it to every shard; each
   opens its warm pool and starts its schedule at t0 on its own clock;
3. while they run, the driver polls their counters (the live display, and when each was last heard
   from), copies the parts of shards that do not see the result folder, and on Ctrl-C or SIGTERM
   stops them all (each records its calls in flight as cancelled);
4. each shard returns its tally packed (`simulator.scale.merge`); a shard that died is reported, and
   its tally is rebuilt from the records it streamed, with its started and unfinished tasks recorded
   as failed (`shard_lost`) and the rest counted as not started;
5. the parts become the folder's calls.jsonl and tasks.jsonl (`simulator.scale.parts`), and the
   merged tally gives the summary: the same form as a single-process run's, plus a ``shards``
   section (each shard's host, tasks, calls, client lag, CPU, connections) and ``ray``.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from ..errors import InputError
from ..live.scrape import open_probe, scraping, server_summary
from ..live.target import make_client, open_target
from ..metrics import histograms, results
from ..metrics.energy import sampled_power
from ..metrics.records import CallRecord
from ..metrics.summary import Summary
from ..metrics.tally import RunTally
from ..redact import Redactor, mask_url
from ..scale import connect, merge, parts, ray_module
from ..scale import plan as shard_plan
from ..scale.fleet import CPUS_PER_SHARD, Fleet, Member
from ..scale.shard import ShardSpec, decode_itl
from ..scenario import Scenario
from ..task_run import DriverResult, driver_settings
from ..workload import Workload
from .execute import execute_async
from .live import LiveOptions, Progress, describe_live
from .plan import RunPlan, measurement_window, plan_run
from .record import Outcome, Recorder



def shard_specs(scenario: Scenario, workload: Workload, target: Any, folder: Path, count: int,
                warm: Optional[Sequence[int]] = None) -> list[ShardSpec]:
    """The shards' specs: tasks dealt round-robin, limits divided, one part folder each."""
    from ..live.ahead import expected_concurrency  # noqa: PLC0415

    run = scenario.run
    token = parts.mark(folder)
    pieces = shard_plan.split(workload, count)
    in_flight = shard_plan.split_limit(run.max_in_flight, count)
    connections = shard_plan.split_limit(target.max_connections, count)
    specs = []
    for i, piece in enumerate(pieces):
        settings = {**driver_settings(run), "max_in_flight": in_flight[i]}
        shard_target = dataclasses.replace(target, max_connections=connections[i] or 0)
        specs.append(ShardSpec(
            index=i, workload=piece, target=shard_target, seed=run.seed, driver=settings,
            window=measurement_window(scenario, workload), slo=scenario.slo,
            part=str(parts.part_folder(folder, i)), token=token,
            warm=expected_concurrency(piece) if warm is None else warm[i]))
    return specs


def _count(ray: Any, scenario: Scenario, workload: Workload, workers: Any) -> int:
    """Shards for this run, checked against the cluster's CPUs and the run's limits (shards wait for
    CPUs other work holds, up to `READY_TIMEOUT`)."""
    cpus = ray.cluster_resources().get("CPU", 0.0)
    count = shard_plan.shard_count(workers, workload, cpus // CPUS_PER_SHARD)
    for limit, name in ((scenario.run.max_in_flight, "run.max_in_flight"),
                        (scenario.target.max_connections if scenario.target else 0, "target.max_connections")):
        if limit and count > limit:
            count = limit  # each shard needs a share of at least one
    if count * CPUS_PER_SHARD > cpus:
        raise InputError(f"{count} shards need {count * CPUS_PER_SHARD:g} CPUs of the Ray cluster, which has "
                         f"{cpus:g} (run.workers sets the number of shards)", field="workers",
                         file=scenario.source, path="run.workers")
    return count


@dataclass
class ShardedExecutor(LiveOptions):
    """Replays a plan over shards on Ray (see the module docstring): `address` of the cluster (None:
    RAY_ADDRESS or a new local one), `workers` overriding ``run.workers`` (a number, or 'auto'),
    `on_fleet` told of the started shards (tests kill one)."""

    address: Optional[str] = None
    workers: Any = None
    on_fleet: Optional[Callable[[Fleet], None]] = None

    async def replay(self, plan: RunPlan, recorder: Recorder) -> Outcome:
        # One method over 30 lines: the emulator, the signal handling and the shards must all live
        # exactly as long as the replay, which nested blocks say most plainly.
        scenario, workload, folder = plan.scenario, plan.workload, plan.folder
        assert scenario is not None, "a sharded run replays a scenario"
        ray = ray_module()
        workers = self.workers if self.workers is not None else getattr(scenario.run, "workers", None)
        connected = connect(ray, self.address)
        fleet: Optional[Fleet] = None
        try:
            with self.stopping() as stopper:  # after connecting: Ray's own handlers must not replace the run's
                async with open_target(scenario) as target:
                    async with make_client(target, scenario.run) as client:
                        checked = await self.check(client)
                        target = dataclasses.replace(target, model=client.model)
                    redact = Redactor(target.secrets())
                    probe, note = await open_probe(scenario, target.root, redact)
                    count = _count(ray, scenario, workload, workers)
                    where = mask_url(self.address) if self.address else "local"
                    describe_live(recorder, scenario, target, checked, ray={"address": where, "shards": count})
                    stopper.folder_made = True
                    fleet = Fleet(ray, shard_specs(scenario, workload, target, folder, count))
                    stopper.driver = fleet
                    if stopper.signum is not None:
                        fleet.stop()
                    await fleet.ready()
                    t0_wall = fleet.start()
                    if self.on_fleet is not None:
                        self.on_fleet(fleet)
                    t0 = time.perf_counter() + (t0_wall - time.time())
                    async with scraping(probe, t0, folder) as sync_samples:
                        await fleet.watch(functools.partial(_tick, fleet, len(workload.tasks), self.on_progress,
                                                            sync_samples))
        finally:
            if fleet is not None:
                fleet.kill()
            if connected:
                ray.shutdown()
        return _finish(plan, recorder, fleet, probe, note, redact, interrupted=stopper.signum is not None)


async def run_sharded(scenario: Scenario, workload: Workload, folder: Path,
                      **options: Any) -> tuple[Summary, DriverResult]:
    """Replay `workload` as `scenario` says into `folder` over shards on Ray (`ShardedExecutor`, whose
    keyword options `options` are); returns (summary, how it ended)."""
    return await execute_async(plan_run(scenario, workload, folder), ShardedExecutor(**options))


def _tick(fleet: Fleet, total: int, on_progress: Optional[Callable[[Progress], None]],
          sync_samples: Optional[Callable[[], None]]) -> None:
    """After each poll of the shards: the new /metrics scrapes saved, the live display updated."""
    if sync_samples is not None:
        sync_samples()
    if on_progress is not None:
        started, in_flight, counters = fleet.counters()
        on_progress(Progress(fleet.now(), total, started, in_flight, counters))


def _finish(plan: RunPlan, recorder: Recorder, fleet: Fleet, probe: Any, note: Optional[str], redact: Redactor, *,
            interrupted: bool) -> Outcome:
    """The shards' tallies merged (a dead shard's rebuilt from its part), the parts merged into the
    folder's record files, and the ``shards`` and ``ray`` sections of the summary."""
    scenario, folder, window = plan.scenario, plan.folder, plan.window
    assert scenario is not None
    packs, itl, figures = [], histograms.new_histogram(), []
    for m in fleet.members:
        if m.result is not None:
            packs.append(m.result.tally)
            itl.add(decode_itl(m.result.itl))
        else:
            pack, part_itl = _rebuild_lost(m, window, scenario)
            packs.append(pack)
            if part_itl is not None:
                itl.add(part_itl)
        figures.append(_shard_figures(m, packs[-1], window, scenario))
    started = parts.merge_parts(folder, len(fleet.members))
    tally = merge.merged(window, scenario.slo, packs)
    lost = [m.index for m in fleet.members if m.result is None]
    reasons = {m.result.stop_reason for m in fleet.members if m.result is not None}
    stop_reason = ("interrupted" if interrupted else "shard_lost" if lost else
                   next((r for r in ("drain_timeout", "cancelled") if r in reasons), "completed"))
    end = max([m.heard for m in fleet.members] + [0.0])
    result = DriverResult(stop_reason, started, max(0, len(plan.workload.tasks) - started), end)
    for record in _in_end_order(folder):
        (recorder.server.call if isinstance(record, CallRecord) else recorder.server.task)(record)
    server = server_summary(folder, probe, note, recorder.server, scenario.run.scrape_interval, redact)
    for m, shard in zip(fleet.members, figures):
        results.write_json(parts.part_folder(folder, m.index), parts.SHARD_FILE, shard)
    return Outcome(result, itl, server, shards=figures, ray={"shards": len(fleet.members), "lost": lost},
                   tally=tally, energy=sampled_power(probe.samples) if probe is not None else None)


def _in_end_order(folder: Path) -> Iterator[Any]:
    """The folder's call and task records merged by end time (a task's calls before it), so that a
    running-task table needs only the tasks in flight at each point."""
    calls = ((c.end, 0, c) for c in results.iter_calls(folder))
    tasks = ((t.end, 1, t) for t in results.iter_tasks(folder))
    for _, _, record in heapq.merge(calls, tasks, key=lambda item: (item[0], item[1])):
        yield record


def _rebuild_lost(member: Member, window: Any, scenario: Scenario) -> tuple[merge.Packed, Any]:
    """A dead shard's tally from the records it streamed, its started and unfinished tasks recorded
    as failed (`parts.LOST`); with the ITL histogram it saved last (None when none)."""
    part = Path(member.spec.part)
    tally = RunTally(window, scenario.slo)
    ok_calls: Counter = Counter()
    for call in results.iter_calls(part):
        tally.call(call)
        member.heard = max(member.heard, call.end)
        if call.ok:
            ok_calls[call.task_id] += 1
    finished = []
    for task in results.iter_tasks(part):
        tally.task(task)
        member.heard = max(member.heard, task.end)
        if task.parent_id is None:
            finished.append(task.task_id)
    saved = (results.read_json(part, results.PROGRESS_FILE) or {}).get("tasks_started") or 0
    started = max(int(saved), int(member.progress.get("started", 0)))
    member.progress["started"] = started
    lost = parts.lost_records(member.spec.workload.tasks, started, finished, ok_calls, member.heard)
    parts.append_tasks(part, lost)
    for record in lost:
        tally.task(record)
    if started > int(saved):
        results.write_json(part, results.PROGRESS_FILE, {"tasks_started": started})
    hist_file = part / results.HISTOGRAMS_FILE
    itl = histograms.load(hist_file).get("itl") if hist_file.exists() else None
    return merge.pack(tally), itl


def _shard_figures(member: Member, packed: merge.Packed, window: Any, scenario: Scenario) -> dict[str, Any]:
    """One shard's line of the ``shards`` section: where it ran, its tasks and calls, its client lag,
    its CPU and connections; a dead shard's error."""
    tally = merge.merged(window, scenario.slo, [packed])
    lag = histograms.stats_ms(tally.hist["client_lag"])
    out: dict[str, Any] = {
        "index": member.index, "host": member.info.get("host"), "lost": member.result is None,
        "tasks": len(member.spec.workload.tasks), "calls": tally.attempts, "calls_ok": tally.calls_ok,
        "output_tokens": tally.output_tokens,
        "client_lag_ms": {"p50": lag["p50"], "p99": lag["p99"], "max": lag["max"]},
    }
    r = member.result
    if r is None:
        out.update(error=member.error or "stopped answering", tasks_started=member.progress.get("started", 0),
                   last_heard_s=member.heard)
        return out
    out.update(
        tasks_started=r.tasks_started, stop_reason=r.stop_reason, cpu_s=r.cpu_s, loop_cpu_s=r.loop_cpu_s,
        wall_s=r.wall_s, cpu_share=r.cpu_s / r.wall_s if r.wall_s > 0 else 0.0,
        cpu_wait_share=None if r.loop_wait_s is None or r.wall_s <= 0 else r.loop_wait_s / r.wall_s,
        connections_warm=r.connections_warm, connections_opened=r.connections_opened,
        bodies_prepared=r.bodies_prepared, start_ahead_ms=-1000 * r.start_late_s,
        part=r.part if not r.shared else None,
    )
    return out
