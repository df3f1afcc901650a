"""How close the Bayesian search of a config space (`space.method: tpe`) comes to the grid's best, and with
how many twin evaluations (not run as a test; prints its figures).

The space: five settings of the calibrated tiny vLLM CPU profile (`tiny-vllm-cpu`), 2,048 combinations:
max_num_seqs 4 to 32 (step 4), max_num_batched_tokens 512 to 2,048 (step 512), block_size 16, 32, 64 or
128, num_blocks 256 to 2,048 (step 256), async scheduling off or on. A candidate whose KV pool cannot hold
one 4,096-token sequence (256 blocks of 16 tokens at least) is infeasible, never simulated.

A candidate's figure is its capacity within the SLO: the study's capacity search (`simulator.study.
capacity.search`: bracket from 0.2 and 0.8 sessions a second, bisect to 5%) over 25 Claude Code sessions
generated from the fitted model (`models/claude-code.yaml`, seed 11, ~600 calls, prompts scaled to 3%,
each session's calls back to back), judged as the study judges a probe: every SLO target (median
session within 8 s, 95% of first tokens within 1 s) over the judged sessions, at most 1% failed, and a
rate whose arrivals last under two median session times is a burst that cannot test it. Each probe is
one simulation on the twin, in memory (no result folder): the workload's arrivals rescaled to the rate
as a study's rate point does, the records counted into the summary by the summary's own code.

1. The grid: every candidate's capacity, by brute force over 2 processes, once; kept in
   benchmarks/search_accuracy_grid.json with the commit it ran at and the settings above, and reused
   while the settings are the same (--fresh runs it again, as after a change to the twin's records).
2. The search: `simulator.study.search.run` (the study's own search, Optuna's TPE sampler) with a budget
   of 10% of the grid's candidates (204), 5 seeds, each candidate's capacity looked up in the grid's
   figures (the twin is deterministic: looking it up is what simulating it again would give). Each seed's
   best found, its share of the grid's best, and the evaluations it used; then the mean share.

Target: within 3% of the grid's best on average.

    .venv/bin/python benchmarks/search_accuracy.py [--fresh] [--processes 2] [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(__file__).with_name("search_accuracy_grid.json")

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
SEEDS = 5
BUDGET_SHARE = 0.10
TARGET = 0.97


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


# --- one candidate's capacity on the twin ---------------------------------------------------------------


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


def capacity_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The candidate's capacity (tasks/h, as a study's goodput objective reads its capacity search) and the
    search's status, or why it is infeasible."""
    from simulator.metrics.results import Window
    from simulator.metrics.summary import from_tally
    from simulator.metrics.tally import RunTally
    from simulator.sim.driver import SimDriver
    from simulator.study import feasible
    from simulator.study.capacity import HELD, MISSED, UNTESTABLE, combine, search
    from simulator.study.figures import slo_met
    from simulator.study.load import LoadPoint, apply
    from simulator.study.points import MIN_SPAN_TASK_TIMES
    from simulator.study.space import candidate_of

    profile, infeasible = feasible.profile_of(PROFILE, candidate_of(settings).overlay())
    if infeasible is not None:
        return {"infeasible": infeasible.reason, "violation": infeasible.violation}
    scenario, workload, rate0 = _workload()
    simulations = [0]

    def probe(rate: float) -> Optional[str]:
        loaded = apply(workload, scenario.run, LoadPoint("rate", rate), rate0)
        tally = RunTally(Window(), scenario.slo)
        SimDriver(loaded.workload, profile, tally, keep_gaps=False, fast_decode=True).run()
        summary, _ = from_tally(tally)
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


def _evaluate(item: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    name, settings = item
    began = time.process_time()
    figure = capacity_of(settings)
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


def definition() -> dict[str, Any]:
    """What the grid's figures depend on (besides the code): the scenario, the profile, the space, the
    capacity search."""
    return {"scenario": SCENARIO.replace(str(ROOT), "<repo>"), "profile": PROFILE,
            "space": SPACE.split("space:")[1].replace("BUDGET", "-").replace("SEED", "-"), "capacity": CAPACITY,
            "max_failed_share": MAX_FAILED_SHARE}


def brute_force(processes: int) -> dict[str, Any]:
    """Every candidate's figure, `processes` at a time; printed as it goes."""
    candidates = grid_candidates()
    items = [(c.name, c.settings) for c in candidates]
    figures: dict[str, dict[str, Any]] = {}
    began = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        for k, (name, figure) in enumerate(pool.imap_unordered(_evaluate, items, chunksize=4), 1):
            figures[name] = figure
            if k % 128 == 0 or k == len(items):
                print(f"  grid: {k:,} of {len(items):,} candidates in {time.perf_counter() - began:,.0f} s",
                      file=sys.stderr, flush=True)
    return {"commit": commit(), "definition": definition(), "wall_s": time.perf_counter() - began,
            "processes": processes, "figures": {c.name: compact(figures[c.name]) for c in candidates}}


def compact(figure: dict[str, Any]) -> dict[str, Any]:
    """A candidate's figure as the cache keeps it (its settings are its name's; CPU time to the ms)."""
    return {k: round(v, 3) if k == "cpu_s" else v for k, v in figure.items() if k != "settings"}


def grid(fresh: bool, processes: int) -> dict[str, Any]:
    """The grid's figures: the cached ones when they were computed with these settings."""
    if not fresh and CACHE.is_file():
        kept = json.loads(CACHE.read_text())
        if kept.get("definition") == definition():
            # the twin's records do not change from commit to commit unless a change says so: the
            # figures of the commit they were computed at stand (--fresh computes them again)
            print(f"grid: read from {CACHE.name} (computed at commit {kept['commit']}; now at {commit()})")
            return kept
        print(f"grid: {CACHE.name} is of another definition: computing it again")
    data = brute_force(processes)
    save(data)
    return data


def save(data: dict[str, Any]) -> None:
    """The grid's figures into the cache, one candidate a line (replaced whole: a reader sees the old file or
    the new)."""
    head = json.dumps({k: v for k, v in data.items() if k != "figures"}, indent=1)[:-2]
    lines = ",\n".join(f"  {json.dumps(name)}: {json.dumps(figure)}" for name, figure in data["figures"].items())
    with tempfile.NamedTemporaryFile("w", dir=CACHE.parent, delete=False) as out:
        out.write(f"{head},\n \"figures\": {{\n{lines}\n }}\n}}\n")
    Path(out.name).chmod(0o644)
    Path(out.name).replace(CACHE)


# --- the search ----------------------------------------------------------------------------------------


def search_once(figures: dict[str, dict[str, Any]], budget: int, seed: int) -> tuple[list[str], int]:
    """One search of the space with this seed: (the candidates simulated, in order; trials)."""
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
                out.append(search.Outcome(values=(figure["tasks_per_hour"],)))
        return out

    with tempfile.TemporaryDirectory() as folder:
        search.run(space_spec(budget, seed), ["goodput"], evaluate, Path(folder),
                   asked=lambda candidate: trials.__setitem__(0, trials[0] + 1))
    return [n for n in evaluated if "infeasible" not in figures[n]], trials[0]


def first_within(order: list[str], figures: dict[str, dict[str, Any]], level: float) -> Optional[int]:
    """How many evaluations in `order` it took to reach a candidate of at least `level` (None: never)."""
    for k, name in enumerate(order, 1):
        if figures[name]["tasks_per_hour"] >= level:
            return k
    return None


def random_order(figures: dict[str, dict[str, Any]], budget: int, seed: int) -> list[str]:
    """A random search of the same budget: `budget` feasible candidates drawn without replacement."""
    import numpy as np

    names = sorted(n for n, f in figures.items() if "infeasible" not in f)
    return [names[i] for i in np.random.default_rng(seed).permutation(len(names))[:budget]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", action="store_true", help="compute the grid again even when cached")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args()

    data = grid(args.fresh, args.processes)
    figures = data["figures"]
    feasible = {n: f for n, f in figures.items() if "infeasible" not in f}
    best_name = max(feasible, key=lambda n: feasible[n]["tasks_per_hour"])
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
    shares, reached, random_shares, random_reached = [], [], [], []
    for seed in range(args.seeds):
        began = time.perf_counter()
        order, trials = search_once(figures, budget, seed)
        found = max(order, key=lambda n: figures[n]["tasks_per_hour"])
        value = figures[found]["tasks_per_hour"]
        shares.append(value / best)
        reached.append(first_within(order, figures, level))
        baseline = random_order(figures, budget, seed)
        random_shares.append(max(figures[n]["tasks_per_hour"] for n in baseline) / best)
        random_reached.append(first_within(baseline, figures, level))
        print(f"seed {seed}: best found {value:,.1f} tasks/h, {value / best:.1%} of the grid's best; "
              f"{len(order)} evaluations of {budget} allowed ({len(order) / len(figures):.1%} of the grid), {trials} "
              f"trials; within 3% after {reached[-1] or '-'} evaluations (a random search of the same budget: "
              f"{random_shares[-1]:.1%}, within 3% after {random_reached[-1] or '-'}); {found}  "
              f"({time.perf_counter() - began:.1f} s)")
    mean = statistics.fmean(shares)
    print(f"mean share of the grid's best over {len(shares)} seeds: {mean:.1%} (target at least {TARGET:.0%}): "
          f"{'met' if mean >= TARGET else 'NOT met'}; a random search of the same budget: "
          f"{statistics.fmean(random_shares):.1%}")
    print(f"evaluations to a candidate within 3%: TPE {', '.join(str(r or '-') for r in reached)}; random "
          f"{', '.join(str(r or '-') for r in random_reached)}")


if __name__ == "__main__":
    main()
