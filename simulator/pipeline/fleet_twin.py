"""The fleet on the twin: a plan replayed on replica twins behind a router policy in simulated time
(`FleetTwinExecutor`), into the result folder a live fleet run writes: records streamed (each naming
its replica), each replica's /metrics sampled through its own scraper into ``fleet/<name>_metrics.jsonl``
and summarized as a live replica's scrapes are, then the summary's ``fleet`` section built from those
timelines and the call records by the same code as live (`simulator.metrics.fleet.fleet_figures`).
The ``server`` section is built as a live fleet run's: from the call records, without one server's
timeline. `agentload simulate` picks this executor for a scenario with a ``fleet``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import simpy

from ..fleet.launch import FLEET_DIR
from ..fleet.scrape import metrics_file
from ..scenario.fleet import FleetSpec
from ..fleet.twin import FleetTwin
from ..metrics import results
from ..metrics import server as server_metrics
from ..metrics.fleet import FleetFigures, fleet_figures
from ..sim.profile import ServerProfile
from .fleet_live import SERVER_NOTE
from .plan import RunPlan
from .record import Outcome, Recorder
from .twin import simulate_plan, simulation_stats, twin_energy


class FleetTwinExecutor:
    """Replays a plan on the twin of `fleet`: `fleet.replicas` twins of `profile` behind the policy
    `fleet.router.policy` (`simulator.fleet.twin.FleetTwin`, its draws seeded by the scenario's run seed).
    `keep_gaps` and `fast_decode` as `simulator.pipeline.twin.TwinExecutor`'s. Each replica's /metrics
    are sampled every `plan.scrape_interval` simulated seconds (None: none, and the ``fleet`` section
    has the call records' counts only)."""

    def __init__(self, fleet: FleetSpec, profile: ServerProfile, *, keep_gaps: bool = True,
                 fast_decode: bool = True) -> None:
        self.fleet = fleet
        self.profile = profile
        self.keep_gaps = keep_gaps
        self.fast_decode = fast_decode

    def replay(self, plan: RunPlan, recorder: Recorder) -> Outcome:
        fleet, profile, interval = self.fleet, self.profile, plan.scrape_interval
        started = time.perf_counter()
        names = fleet.replica_names()
        recorder.describe(simulated=True, profile=profile.name, profile_settings=profile.model_dump(mode="json"),
                          fleet=describe(fleet))
        scenario = plan.scenario
        seed = scenario.run.seed if scenario is not None else 0
        logs: dict[str, server_metrics.SampleLog] = {}
        samples: dict[str, list[server_metrics.Sample]] = {name: [] for name in names}
        if interval is not None:
            folder = Path(plan.folder) / FLEET_DIR
            folder.mkdir(parents=True, exist_ok=True)
        built: list[FleetTwin] = []

        def scraped(name: str, t: float, values: dict[str, float]) -> None:
            logs[name].add(t, values)
            samples[name].append(server_metrics.Sample(t, values))

        def server(env: simpy.Environment) -> FleetTwin:
            twin = FleetTwin(env, fleet, profile, keep_gaps=self.keep_gaps, fast_decode=self.fast_decode, seed=seed,
                             on_replica_scrape=scraped if interval is not None else None,
                             source=scenario.source if scenario is not None else None)
            built.append(twin)
            return twin

        try:
            if interval is not None:
                for name in names:
                    logs[name] = server_metrics.SampleLog(folder, metrics_file(name))
            run = simulate_plan(plan, recorder, profile, keep_gaps=self.keep_gaps, fast_decode=self.fast_decode,
                                server=server, on_scrape=(lambda t, values: None) if interval is not None else None)
        finally:
            for log in logs.values():
                log.close()
        twin = built[0]
        simulation = simulation_stats(profile, run, twin.kv_evictions, wall=time.perf_counter() - started)
        simulation.busy_fraction /= len(names)  # the replicas' busy time is summed: their mean share
        server_section = server_metrics.summarize(plan.folder, recorder.server, None, note=SERVER_NOTE)
        timelines = ({name: server_metrics.timeline_summary(samples[name]) for name in names}
                     if interval is not None else {})
        section = fleet_section(fleet, twin, results.read_calls(plan.folder), timelines)
        return Outcome(run.result, run.itl, server_section, simulation=simulation, fleet=section,
                       energy=twin_energy(profile, run, servers=len(names)))


def describe(fleet: FleetSpec) -> dict[str, Any]:
    """run.json's ``fleet`` of a twin run: the replicas (and their pools, disaggregated) and the router
    model with its settings."""
    pd = fleet.disaggregation
    replicas: list[dict[str, Any]] = []
    for i, name in enumerate(fleet.replica_names()):
        entry: dict[str, Any] = {"name": name}
        if pd is not None:
            entry["role"] = "prefill" if i < pd.prefill else "decode"
        replicas.append(entry)
    settings = fleet.router.model_dump(mode="json", exclude={"url", "args", "startup_timeout"})
    out: dict[str, Any] = {"kind": "twin", "replicas": replicas,
                           "router": {"policy": fleet.router.policy, "model": "twin", "settings": settings},
                           "session": fleet.session.model_dump(mode="json")}
    if pd is not None:
        out["disaggregation"] = pd.model_dump(mode="json")
    return out


def fleet_section(fleet: FleetSpec, twin: FleetTwin, calls: list[Any],
                  timelines: dict[str, dict[str, Any]]) -> FleetFigures:
    """The ``fleet`` section (`fleet_figures`, as live). Disaggregated, a prefill replica's /metrics count
    its prefill requests, so the section's `served` and `accounted` are the decode pool's (which answers
    the calls), its prefix-cache hit share the prefill pool's (where prompts are computed), and each
    prefill replica says so in its `note`."""
    figures = fleet_figures(twin.names, calls, timelines, policy=fleet.router.policy)
    pd = fleet.disaggregation
    if pd is None:
        return figures
    prefill = set(twin.names[:pd.prefill])
    for replica in figures.replicas:
        if replica.name in prefill:
            replica.note = "prefill pool: its served requests are the calls' prefills"
    decode = [r for r in figures.replicas if r.name not in prefill]
    if all(r.served is not None for r in decode):
        figures.served = sum(r.served for r in decode)  # type: ignore[misc]
        figures.accounted = figures.served == figures.client_calls
    queries = [timelines.get(name, {}).get("prefix_cache_queries_delta") for name in prefill]
    hits = [timelines.get(name, {}).get("prefix_cache_hits_delta") for name in prefill]
    if None not in queries and None not in hits and sum(queries):  # type: ignore[arg-type]
        figures.prefix_hit_share = sum(hits) / sum(queries)  # type: ignore[arg-type]
    return figures

