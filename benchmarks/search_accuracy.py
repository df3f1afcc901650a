"""How close the Bayesian search of a config space (`space.method: tpe`) comes to the grid's best, and with
how many twin evaluations (not run as a test; prints its figures). Two parts, one space and one workload,
two objectives (--part capacity, p95 or both).

The space: five settings of the calibrated tiny vLLM CPU profile (`tiny-vllm-cpu`), 2,048 combinations:
max_num_seqs 4 to 32 (step 4), max_num_batched_tokens 512 to 2,048 (step 512), block_size 16, 32, 64 or
128, num_blocks 256 to 2,048 (step 256), async scheduling off or on. A candidate whose KV pool cannot hold
one 4,096-token sequence (256 blocks of 16 tokens at least) is infeasible, never simulated.

The workload: 25 Claude Code sessions generated from the fitted model (`models/claude-code.yaml`, seed
11, ~600 calls, prompts scaled to 3%, each session's calls back to back). Each simulation is one run on
the twin, in memory (no result folder): the workload's arrivals rescaled to a rate as a study's rate
point does (`simulator.study.load.apply`), the records counted into the summary by the summary's own code.

Part 1, capacity (objective goodput, higher is better). A candidate's figure is its capacity within the
SLO: the study's capacity search (`simulator.study.capacity.search`: bracket from 0.2 and 0.8 sessions a
second, bisect to 5%), judged as the study judges a probe: every SLO target (median session within 8 s,
95% of first tokens within 1 s) over the judged sessions, at most 1% failed, and a rate whose arrivals
last under two median session times is a burst that cannot test it. Target: the search's best within 3%
of the grid's best (found >= 0.97 x best) on average. What it shows is limited: the landscape is flat at
the top (the bisection gives only 14 distinct capacities over the grid, and a third of the grid is
within 3% of the best), so a random search of the same budget meets the target as well as TPE does.

Part 2, p95 (objective p95_task, lower is better): the study's "p95 task time at a sweep point", at one
fixed load, 1.7 sessions a second: one simulation per candidate, its figure the summary's p95 of task
completion time (`from_tally`: the completed sessions' HDR histogram, 3 significant digits; a study's
p95_task is np.percentile of the point's completion times, the same to within the histogram's 0.1%). It
exists because part 1 cannot tell a search from a random draw; here the top is narrow. The rate: a sample
of 50 random candidates at 0.3 to 2.5 sessions/s, then 300 at 1.4 to 2.5. At 0.3 to 1.0 (the middle of
the grid's capacities, 0.23 to 1.50) the load is light for most candidates and their p95 is the same
(10 to 22 distinct values of 50, two thirds within 3% of the sample's best); at 1.3 a third still was;
at 1.4 (full grid) 6.9% of the grid was within 3% of the best and 44% within 10%; at 1.7 (full grid)
3.5% is within 3% of the best and 5% within 10%, with 191 distinct values: the best candidate's p95
is 14.3 s (12.6 s at 1.4/s), the median one's 18.5 s, the worst's 147 s. Above it (2.0, 2.5, beyond
every candidate's capacity; the best p95 16.7 and 18.5 s) the share fell little (2.7 to 3.7% of the
sample). No rate brings it lower: the twin's p95 does not depend on async scheduling at all and little
on num_blocks from 1,024 blocks on, so candidates tie in sets. So a random
search of 204 still hits the band almost surely (the report prints the chance it misses); what tells the
searches apart is the evaluations each takes to reach it. A candidate whose run fails a call or leaves a
session unfinished is incomplete: its p95 (of the completed sessions only) is kept in the grid but it
ranks below every complete candidate: it never counts as a best, and the search is told +inf for it
(Optuna ranks it last). Target: the search's best within 3% of the grid's best, found <= 1.03 x best,
with found / best averaged over the seeds.

Each part:
1. The grid: every candidate's figure, by brute force, once; kept in benchmarks/search_accuracy_grid.json
   (capacity) or benchmarks/search_accuracy_p95_grid.json (p95) with the commit it ran at and the
   definition above, and reused while the definition is the same (--fresh runs it again, as after a
   change to the twin's records).
2. The search: `simulator.study.search.run` (the study's own search, Optuna's TPE sampler) with a budget
   of 10% of the grid's candidates (204), 5 seeds, each candidate's figure looked up in the grid (the twin
   is deterministic: looking it up is what simulating it again would give). Each seed's best found, its
   ratio to the grid's best, the evaluations it used and took to come within 3%, beside a random search
   of the same budget; then the mean ratio, and the share of the grid within 3% of the best.

    .venv/bin/python benchmarks/search_accuracy.py [--part capacity|p95|both] [--fresh] [--processes 2] [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(__file__).with_name("search_accuracy_grid.json")
P95_CACHE = Path(__file__).with_name("search_accuracy_p95_grid.json")

SCENARIO = f"""\
name: search-accuracy
workload:
  model: {ROOT / 'models' / 'claude-code.yaml'}
  generate: {{tasks: 25, seed: 11, rate: 0.5}}
  transforms: {{token_scale: 0.03, context_cap: 3800, gap_cap: 0}}
run: {{seed: 11}}
slo:
  task_s: {{p50: 8}}
  ttft_ms: {{p95: 1000}}
"""
PROFILE = "tiny-vllm-cpu"
SPACE = """\
workload: {synthetic: {input_tokens: 1, output_tokens: 1, concurrency: 1}}
configs: {base: {name: base, profile: tiny-vllm-cpu}}
capacity: {low: 0.2}
space:
  method: tpe
  settings:
    scheduler.max_num_seqs: {low: 4, high: 32, step: 4}
    scheduler.max_num_batched_tokens: {low: 512, high: 2048, step: 512}
    kv_cache.block_size: [16, 32, 64, 128]
    kv_cache.num_blocks: {low: 256, high: 2048, step: 256}
    scheduler.async_scheduling: [false, true]
  budget: BUDGET
  seed: SEED
"""
CAPACITY = {"low": 0.2, "high": 0.8, "precision": 0.05, "max_probes": 12}
MAX_FAILED_SHARE = 0.01
P95_RATE = 1.7
"""Sessions a second the p95 part runs every candidate at (module doc: why this rate)."""
SEEDS = 5
BUDGET_SHARE = 0.10
TARGET = 0.97
"""Capacity: the search's best at least this share of the grid's best."""
P95_TARGET = 1.03
"""p95: the search's best at most this multiple of the grid's best."""


def space_spec(budget: int, seed: int) -> Any:
    from simulator.study import schema

    text = SPACE.replace("BUDGET", str(budget)).replace("SEED", str(seed))
    return schema.parse(text, "<search_accuracy space>").space


def grid_candidates() -> list[Any]:
    """Every candidate of the space, in the grid's order."""
    from simulator.study import search
    from simulator.study.space import candidate_of
    import itertools

    grid = search.grid_of(space_spec(1, 0))
    keys = list(grid)
    return [candidate_of(dict(zip(keys, values))) for values in itertools.product(*(grid[k] for k in keys))]


# --- one candidate on the twin --------------------------------------------------------------------------


_WORKLOAD: Optional[tuple[Any, Any, float]] = None


def _workload() -> tuple[Any, Any, float]:
    """(the scenario, its workload, the workload's own rate), made once a process."""
    global _WORKLOAD
    if _WORKLOAD is None:
        from simulator import scenario as scenario_mod
        from simulator.transforms import task_rate

        scenario = scenario_mod.parse(SCENARIO, str(ROOT / "benchmarks" / "search_accuracy.yaml"))
        workload = scenario_mod.load_workload(scenario)
        _WORKLOAD = (scenario, workload, task_rate(workload))
    return _WORKLOAD


def _profile(settings: dict[str, Any]) -> tuple[Any, Optional[dict[str, Any]]]:
    """(the candidate's profile, None) or (None, why it is infeasible)."""
    from simulator.study import feasible
    from simulator.study.space import candidate_of

    profile, infeasible = feasible.profile_of(PROFILE, candidate_of(settings).overlay())
    if infeasible is not None:
        return None, {"infeasible": infeasible.reason, "violation": infeasible.violation}
    return profile, None


def simulate(profile: Any, rate: float) -> tuple[Any, Any]:
    """(the summary, the loaded workload) of one run of the workload at `rate` sessions a second."""
    from simulator.metrics.results import Window
    from simulator.metrics.summary import from_tally
    from simulator.metrics.tally import RunTally
    from simulator.sim.driver import SimDriver
    from simulator.study.load import LoadPoint, apply

    scenario, workload, rate0 = _workload()
    loaded = apply(workload, scenario.run, LoadPoint("rate", rate), rate0)
    tally = RunTally(Window(), scenario.slo)
    SimDriver(loaded.workload, profile, tally, keep_gaps=False, fast_decode=True).run()
    summary, _ = from_tally(tally)
    return summary, loaded


def capacity_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The candidate's capacity (tasks/h, as a study's goodput objective reads its capacity search) and the
    search's status, or why it is infeasible."""
    from simulator.study.capacity import HELD, MISSED, UNTESTABLE, combine, search
    from simulator.study.figures import slo_met
    from simulator.study.points import MIN_SPAN_TASK_TIMES

    profile, infeasible = _profile(settings)
    if infeasible is not None:
        return infeasible
    scenario = _workload()[0]
    simulations = [0]

    def probe(rate: float) -> Optional[str]:
        summary, loaded = simulate(profile, rate)
        simulations[0] += 1
        if not slo_met(summary, scenario.slo, MAX_FAILED_SHARE):
            return MISSED
        span = loaded.workload.arrival_span()
        return HELD if span >= MIN_SPAN_TASK_TIMES * summary.tasks.completion_time_s.p50 else UNTESTABLE

    found = combine([search(probe, CAPACITY["low"], CAPACITY["high"], CAPACITY["precision"], CAPACITY["max_probes"],
                            min_rate=CAPACITY["low"] / 16)], 0.9)
    if found.rate is not None:
        value = found.rate * 3600
    elif found.status == "above_range":
        value = found.at_least * 3600  # at least: the study ranks it by its bound
    else:
        value = 0.0  # no rate held
    return {"tasks_per_hour": value, "status": found.status, "simulations": simulations[0]}


def p95_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The candidate's p95 task time at `P95_RATE` (s, the summary's), its completed sessions, those not
    completed and its failed calls; or why it is infeasible."""
    profile, infeasible = _profile(settings)
    if infeasible is not None:
        return infeasible
    summary, _ = simulate(profile, P95_RATE)
    sessions = len(_workload()[1].tasks)
    return {"p95_task_s": summary.tasks.completion_time_s.p95, "completed": summary.tasks.completed,
            "unfinished": sessions - summary.tasks.completed, "failed_calls": summary.failed}


# --- the parts ------------------------------------------------------------------------------------------


def _common() -> dict[str, Any]:
    return {"scenario": SCENARIO.replace(str(ROOT), "<repo>"), "profile": PROFILE,
            "space": SPACE.split("space:")[1].replace("BUDGET", "-").replace("SEED", "-")}


def definition() -> dict[str, Any]:
    """What the capacity grid's figures depend on (besides the code): the scenario, the profile, the space,
    the capacity search."""
    return {**_common(), "capacity": CAPACITY, "max_failed_share": MAX_FAILED_SHARE}


def p95_definition() -> dict[str, Any]:
    """What the p95 grid's figures depend on (besides the code): the scenario, the profile, the space, the
    load and the figure read."""
    return {**_common(), "load": {"axis": "rate", "value": P95_RATE},
            "figure": "summary tasks.completion_time_s.p95 (from_tally), one simulation"}


def p95_value(figure: dict[str, Any]) -> float:
    """A p95 candidate's rank value: its p95, or +inf when a call failed or a session did not complete
    (worse than any complete candidate)."""
    return math.inf if figure["unfinished"] or figure["failed_calls"] else figure["p95_task_s"]


@dataclass(frozen=True)
class Part:
    """One objective over the space: how a candidate is simulated, what its figure is, where it is kept."""

    name: str
    objective: str
    """The study's objective the search is run for."""
    cache: Path
    figure: Callable[[dict[str, Any]], dict[str, Any]]
    definition: Callable[[], dict[str, Any]]
    value: Callable[[dict[str, Any]], float]
    """A feasible candidate's figure as the search is told it and the benchmark ranks it."""
    target: float

    @property
    def higher(self) -> bool:
        """Whether a higher value is better (the study's own sense of its objective)."""
        from simulator.study.search import HIGHER_IS_BETTER

        return HIGHER_IS_BETTER[self.objective]

    def within(self, value: float, best: float) -> bool:
        """Whether `value` is within 3% of `best` (the part's target)."""
        return value >= self.target * best if self.higher else value <= self.target * best

    def best(self, names: list[str], figures: dict[str, dict[str, Any]]) -> str:
        """The best of `names` (the first of equals)."""
        pick = max if self.higher else min
        return pick(names, key=lambda n: self.value(figures[n]))


PARTS = {
    "capacity": Part("capacity", "goodput", CACHE, capacity_of, definition, lambda f: f["tasks_per_hour"], TARGET),
    "p95": Part("p95", "p95_task", P95_CACHE, p95_of, p95_definition, p95_value, P95_TARGET),
}


def _evaluate(item: tuple[str, str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    part, name, settings = item
    began = time.process_time()
    figure = PARTS[part].figure(settings)
    figure["cpu_s"] = time.process_time() - began
    return name, figure


# --- the grid, once -------------------------------------------------------------------------------------


def commit() -> str:
    """The commit the code is at, with '+changes' when simulator/ differs from it (the figures are then
    those of the working tree)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "simulator"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if changed else "")


def brute_force(part: Part, processes: int) -> dict[str, Any]:
    """Every candidate's figure, `processes` at a time (1: in this process); printed as it goes."""
    candidates = grid_candidates()
    items = [(part.name, c.name, c.settings) for c in candidates]
    figures: dict[str, dict[str, Any]] = {}
    began = time.perf_counter()

    def collect(results: Any) -> None:
        for k, (name, figure) in enumerate(results, 1):
            figures[name] = figure
            if k % 128 == 0 or k == len(items):
                print(f"  {part.name} grid: {k:,} of {len(items):,} candidates in {time.perf_counter() - began:,.0f} s",
                      file=sys.stderr, flush=True)

    if processes == 1:
        collect(map(_evaluate, items))
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            collect(pool.imap_unordered(_evaluate, items, chunksize=4))
    return {"commit": commit(), "definition": part.definition(), "wall_s": time.perf_counter() - began,
            "processes": processes, "figures": {c.name: compact(figures[c.name]) for c in candidates}}


def compact(figure: dict[str, Any]) -> dict[str, Any]:
    """A candidate's figure as the cache keeps it (its settings are its name's; CPU time to the ms)."""
    return {k: round(v, 3) if k == "cpu_s" else v for k, v in figure.items() if k != "settings"}


def grid(part: Part, fresh: bool, processes: int) -> dict[str, Any]:
    """The part's grid figures: the cached ones when they were computed with this definition."""
    cache = part.cache
    if not fresh and cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("definition") == part.definition():
            # the twin's records do not change from commit to commit unless a change says so: the
            # figures of the commit they were computed at stand (--fresh computes them again)
            print(f"grid: read from {cache.name} (computed at commit {kept['commit']}; now at {commit()})")
            return kept
        print(f"grid: {cache.name} is of another definition: computing it again")
    data = brute_force(part, processes)
    save(data, cache)
    return data


def save(data: dict[str, Any], cache: Path = CACHE) -> None:
    """The grid's figures into `cache`, one candidate a line (replaced whole: a reader sees the old file or
    the new)."""
    head = json.dumps({k: v for k, v in data.items() if k != "figures"}, indent=1)[:-2]
    lines = ",\n".join(f"  {json.dumps(name)}: {json.dumps(figure)}" for name, figure in data["figures"].items())
    with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False) as out:
        out.write(f"{head},\n \"figures\": {{\n{lines}\n }}\n}}\n")
    Path(out.name).chmod(0o644)
    Path(out.name).replace(cache)


# --- the search ----------------------------------------------------------------------------------------


def search_once(part: Part, figures: dict[str, dict[str, Any]], budget: int, seed: int) -> tuple[list[str], int]:
    """One search of the space for the part's objective with this seed: (the candidates simulated, in
    order; trials)."""
    from simulator.study import search
    from simulator.study.feasible import Infeasible

    evaluated: list[str] = []
    trials = [0]

    def evaluate(batch):
        out = []
        for candidate in batch:
            evaluated.append(candidate.name)
            figure = figures[candidate.name]
            if "infeasible" in figure:
                out.append(search.Outcome(infeasible=Infeasible(figure["infeasible"], figure["violation"])))
            else:
                out.append(search.Outcome(values=(part.value(figure),)))
        return out

    with tempfile.TemporaryDirectory() as folder:
        search.run(space_spec(budget, seed), [part.objective], evaluate, Path(folder),
                   asked=lambda candidate: trials.__setitem__(0, trials[0] + 1))
    return [n for n in evaluated if "infeasible" not in figures[n]], trials[0]


def first_within(part: Part, order: list[str], figures: dict[str, dict[str, Any]], best: float) -> Optional[int]:
    """How many evaluations in `order` it took to reach a candidate within 3% of `best` (None: never)."""
    for k, name in enumerate(order, 1):
        if part.within(part.value(figures[name]), best):
            return k
    return None


def random_order(figures: dict[str, dict[str, Any]], budget: int, seed: int) -> list[str]:
    """A random search of the same budget: `budget` feasible candidates drawn without replacement."""
    import numpy as np

    names = sorted(n for n, f in figures.items() if "infeasible" not in f)
    return [names[i] for i in np.random.default_rng(seed).permutation(len(names))[:budget]]


@dataclass
class Seed:
    """One seed's search and the random search beside it."""

    found: str
    value: float
    evaluations: int
    trials: int
    reached: Optional[int]
    random_value: float
    random_reached: Optional[int]
    seconds: float


def searches(part: Part, figures: dict[str, dict[str, Any]], best: float, budget: int, seeds: int) -> list[Seed]:
    """Each seed's search and a random search of the same budget."""
    out = []
    for seed in range(seeds):
        began = time.perf_counter()
        order, trials = search_once(part, figures, budget, seed)
        found = part.best(order, figures)
        baseline = random_order(figures, budget, seed)
        out.append(Seed(found, part.value(figures[found]), len(order), trials, first_within(part, order, figures, best),
                        part.value(figures[part.best(baseline, figures)]), first_within(part, baseline, figures, best),
                        time.perf_counter() - began))
    return out


def _reached(seeds: list[Seed]) -> str:
    return (f"evaluations to a candidate within 3%: TPE {', '.join(str(s.reached or '-') for s in seeds)}; random "
            f"{', '.join(str(s.random_reached or '-') for s in seeds)}")


# --- the report ----------------------------------------------------------------------------------------


def report_capacity(data: dict[str, Any], seeds: int) -> None:
    part = PARTS["capacity"]
    figures = data["figures"]
    feasible = {n: f for n, f in figures.items() if "infeasible" not in f}
    best_name = part.best(list(feasible), figures)
    best = feasible[best_name]["tasks_per_hour"]
    cpu = [f["cpu_s"] for f in feasible.values()]
    sims = [f["simulations"] for f in feasible.values()]
    statuses = statistics.multimode(f["status"] for f in feasible.values())
    print(f"grid: {len(figures):,} candidates, {len(feasible):,} feasible ({len(figures) - len(feasible):,} "
          f"infeasible); computed at commit {data['commit']} in {data['wall_s']:,.0f} s on {data['processes']} "
          f"processes; per candidate {statistics.fmean(sims):.1f} simulations, {statistics.fmean(cpu):.2f} s CPU "
          f"(median {statistics.median(cpu):.2f} s); commonest search status: {', '.join(statuses)}")
    print(f"grid best: {best:,.1f} tasks/h ({best_name}); candidates within 3% of it: "
          f"{sum(f['tasks_per_hour'] >= TARGET * best for f in feasible.values()):,}")

    budget = int(BUDGET_SHARE * len(figures))
    level = TARGET * best
    at_best = sum(f["tasks_per_hour"] >= best for f in feasible.values())
    distinct = len({round(f["tasks_per_hour"], 6) for f in feasible.values()})
    print(f"grid best reached by {at_best:,} candidates (the capacity search's bisection gives {distinct} distinct "
          f"values over the grid); "
          f"a random draw is within 3% of the best with probability {sum(f['tasks_per_hour'] >= level for f in feasible.values()) / len(feasible):.1%}")
    runs = searches(part, figures, best, budget, seeds)
    for seed, s in enumerate(runs):
        print(f"seed {seed}: best found {s.value:,.1f} tasks/h, {s.value / best:.1%} of the grid's best; "
              f"{s.evaluations} evaluations of {budget} allowed ({s.evaluations / len(figures):.1%} of the grid), "
              f"{s.trials} trials; within 3% after {s.reached or '-'} evaluations (a random search of the same "
              f"budget: {s.random_value / best:.1%}, within 3% after {s.random_reached or '-'}); {s.found}  "
              f"({s.seconds:.1f} s)")
    mean = statistics.fmean(s.value / best for s in runs)
    print(f"mean share of the grid's best over {len(runs)} seeds: {mean:.1%} (target at least {TARGET:.0%}): "
          f"{'met' if mean >= TARGET else 'NOT met'}; a random search of the same budget: "
          f"{statistics.fmean(s.random_value / best for s in runs):.1%}")
    print(_reached(runs))


def report_p95(data: dict[str, Any], seeds: int) -> None:
    part = PARTS["p95"]
    figures = data["figures"]
    feasible = {n: f for n, f in figures.items() if "infeasible" not in f}
    complete = [n for n, f in feasible.items() if math.isfinite(part.value(f))]
    best_name = part.best(complete, figures)
    best = part.value(figures[best_name])
    values = [part.value(feasible[n]) for n in complete]
    cpu = [f["cpu_s"] for f in feasible.values()]
    within = sum(part.within(v, best) for v in values)
    print(f"grid: {len(figures):,} candidates, {len(feasible):,} feasible ({len(figures) - len(feasible):,} "
          f"infeasible), {len(feasible) - len(complete):,} incomplete (a failed call or an unfinished session: "
          f"ranked below every complete one, told to the search as +inf); computed at commit {data['commit']} in "
          f"{data['wall_s']:,.0f} s on {data['processes']} process(es); per candidate 1 simulation at "
          f"{P95_RATE} sessions/s, {statistics.fmean(cpu):.2f} s CPU (median {statistics.median(cpu):.2f} s)")
    print(f"grid best: p95 {best:.3f} s ({best_name}); within 3% of it (p95 <= {P95_TARGET} x best = "
          f"{P95_TARGET * best:.3f} s): {within:,} candidates, {within / len(feasible):.1%} of the feasible grid "
          f"(the probability a random draw is); {len({round(v, 6) for v in values}):,} distinct values; median "
          f"{statistics.median(values):.2f} s, worst complete {max(values):.2f} s")
    budget = int(BUDGET_SHARE * len(figures))
    miss = math.comb(len(feasible) - within, budget) / math.comb(len(feasible), budget)
    print(f"a random search of {budget} evaluations misses the 3% band with probability {miss:.2g}")
    runs = searches(part, figures, best, budget, seeds)

    def ratio(value: float) -> str:
        return f"found/best {value / best:.3f} ({'within' if part.within(value, best) else 'NOT within'} 3%)"

    for seed, s in enumerate(runs):
        print(f"seed {seed}: best found p95 {s.value:.3f} s, {ratio(s.value)}; {s.evaluations} evaluations of "
              f"{budget} allowed ({s.evaluations / len(figures):.1%} of the grid), {s.trials} trials; within 3% after "
              f"{s.reached or '-'} evaluations (a random search of the same budget: p95 {s.random_value:.3f} s, "
              f"{ratio(s.random_value)}, within 3% after {s.random_reached or '-'}); {s.found}  ({s.seconds:.1f} s)")
    mean = statistics.fmean(s.value / best for s in runs)
    random_mean = statistics.fmean(s.random_value / best for s in runs)
    print(f"mean found/best over {len(runs)} seeds: {mean:.3f} (target at most {P95_TARGET}: found <= "
          f"{P95_TARGET} x best): {'met' if mean <= P95_TARGET else 'NOT met'}; seeds within 3%: TPE "
          f"{sum(part.within(s.value, best) for s in runs)} of {len(runs)}; a random search of the same budget: "
          f"mean {random_mean:.3f}, {'met' if random_mean <= P95_TARGET else 'NOT met'}, seeds within 3% "
          f"{sum(part.within(s.random_value, best) for s in runs)} of {len(runs)}")
    print(_reached(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["capacity", "p95", "both"], default="both")
    parser.add_argument("--fresh", action="store_true", help="compute the grid again even when cached")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args()

    if args.part in ("capacity", "both"):
        print("== part 1: capacity within the SLO (objective goodput, higher is better)")
        report_capacity(grid(PARTS["capacity"], args.fresh, args.processes), args.seeds)
    if args.part in ("p95", "both"):
        print(f"== part 2: p95 task time at {P95_RATE} sessions/s (objective p95_task, lower is better)")
        report_p95(grid(PARTS["p95"], args.fresh, args.processes), args.seeds)


if __name__ == "__main__":
    main()
