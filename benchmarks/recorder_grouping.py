"""How well does the recorder's task grouping (`simulator.recorder.grouping`) find the tasks of replayed agent
traffic, and what does it cost per call?

Each workload is replayed on a simple clock, as `agentload run` would send it: a task's call goes out at the
previous call's end (or its sub-agents' join) plus its gap plus a client lag (exponential, mean `--lag`),
and takes ``ttft + input / prefill + output * itl`` seconds (times a lognormal factor of spread 0.3). Every
call's prompt becomes the recorder's chained 16-token block ids: each trace block of the workload expands
into block_size / 16 ids and the part of the prompt after its last trace block is fresh, as the live
client fills it. The calls' arrivals and ends are fed to `TaskGrouper` in time order, without keys and with
the top-level task's id as key, and the found tasks are scored against the true ones:

- ``right``: share of calls in the right top-level task (true and found tasks matched one to one so that
  the matched pairs share the most calls; the calls of matched pairs are right), the grouper's revisions
  and its `close` applied;
- ``subs found``: true sub-tasks matched (one to one, inside matched top-level tasks) to a found sub-task
  holding most of their calls, over all true sub-tasks; ``subs wrong``: found sub-tasks not so matched;
- ``us/call``: microseconds of `place` plus `end` per call; ``chains``: most chains held at once;
  ``revised``: revisions of timing's guesses.

Workloads (`--workload`): ``accept`` is the recorder's end-to-end workload (tests/recorder_runs.py: Claude
Code tasks from models/claude-code.yaml with sub-agents after 8% of calls, prompts at 2% of their size, gaps
squashed under 0.3 s); ``generated`` the same model at full size (sub-agents after `--spawn-prob` of
calls); ``traces`` the shipped Claude Code sessions (traces/claude-code) arriving at `--rates`.
`--system-prompt N` starts every top-level task's prompts with the same N tokens and every sub-agent's with
another N (tasks then share a prefix that is no evidence).

    python benchmarks/recorder_grouping.py                                   # all three, default grid
    python benchmarks/recorder_grouping.py --workload accept --rates 2 8 --windows 0.01 0.05 0.2
    python benchmarks/recorder_grouping.py --workload generated --system-prompt 4096 --lag 0.01

Measured (2 shared CPUs, seed 1, 200 tasks; spawn window 0.05 s, the default; `right` without key / with):

    workload    tasks/s  calls/s  right (no key)  subs found  subs wrong   right (key)
    accept        0.5      29       99.5%          702/706      4/706       100%
    accept        2       100       98.8%          695/706     17/712       100%
    accept        8       237       97.3%          690/706     42/732       100%
    generated     0.5-8             98.4-99.0%     347/349     4-9/352      100%
    traces (7 sessions)            100%              4/4        0/4         100%
    --system-prompt 4096, 2/s: accept 98.5%, generated 98.1%

The window (`--windows`, accept at 2 and 8 tasks/s): with a mean client lag of 2 ms, 0.005 s finds 94%,
0.01-0.05 s 98-99%, 0.2 s 97-97.5% (more false guesses to correct); with a 10 ms lag, 0.01 s finds 75%,
0.05 s 97.7% and 95.6% (at 236 calls/s), 0.1 s 97.6% and 94.5%: hence 0.05 s. `--speed`: 300 live chains
of 2,000-id prompts and 1,000 compacted ones, 30-55 us a call continuing a chain, 70-120 us a chain's
first call (a look-up per id among the compacted chains); a third of it is the garbage collector going
through the 2,000-id lists each call makes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from grouping_replay import Clock, events, group, replay, score, with_system_prompt  # noqa: E402
from recorder_runs import agent_workload  # noqa: E402

from simulator import traces  # noqa: E402
from simulator.recorder.grouping import DEFAULT_SPAWN_WINDOW, TaskGrouper  # noqa: E402
from simulator.workload import Workload  # noqa: E402


def workloads(args: argparse.Namespace, rate: float) -> Iterator[tuple[str, Workload, Clock]]:
    for name in args.workload:
        if name == "accept":
            w = agent_workload(args.tasks, rate, args.seed, spawn_prob=args.accept_spawn_prob)
            clock = Clock(ttft=0.02, itl=0.002, lag=args.lag)
        elif name == "generated":
            w = _full_size(args, rate)
            clock = Clock(ttft=0.05, prefill=50000.0, itl=0.015, lag=args.lag)
        else:
            w = _traces(rate, args.seed)
            clock = Clock(ttft=0.05, prefill=50000.0, itl=0.015, lag=args.lag)
        yield name, with_system_prompt(w, args.system_prompt), clock


def _full_size(args: argparse.Namespace, rate: float) -> Workload:
    """Claude Code tasks from the shipped model at full size, gaps as drawn, sub-agents after `--spawn-prob` of calls."""
    import yaml

    from simulator.model.generate import generate
    from simulator.model.schema import WorkloadModel

    raw = yaml.safe_load((ROOT / "models" / "claude-code.yaml").read_text())
    for cls in raw["classes"].values():
        cls["structure"]["subagents"]["spawn_prob"] = args.spawn_prob
    return generate(WorkloadModel.model_validate(raw), tasks=args.tasks, rate=rate, seed=args.seed)


def _traces(rate: float, seed: int) -> Workload:
    """The shipped Claude Code sessions, arriving as a Poisson process at `rate`."""
    w = traces.load([ROOT / "traces" / "claude-code"])
    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(1.0 / rate, len(w.tasks)))
    return Workload(tuple(dataclasses.replace(t, arrival=float(a)) for t, a in zip(w.tasks, at)), w.provenance)


def speed(numpy_ids: bool, collect: bool = True, chains: int = 300, ids: int = 2000, calls: int = 20000,
          first_share: float = 0.05, seed: int = 1) -> tuple[float, float]:
    """Microseconds per call (place + end) with `chains` live chains whose prompts hold about `ids` block
    ids: (continuing calls, first calls of new chains). Each call either continues a chain (its prompt
    less its last 0-3 ids, plus 4-60 new ones) or, with `first_share`, starts a new chain of `ids` fresh
    ids; a thousand compacted chains wait besides. The ids come as a list of ints (as the recorder's
    `block_ids` gives them) or as the numpy array they are computed in (`numpy_ids`); with `collect`
    False, the garbage collector is paused while calls are timed (its share of the cost: mostly going
    through the young 2,000-id containers that each call makes)."""
    rng = np.random.default_rng(seed)
    grouper = TaskGrouper(compact_after=1000.0, idle_timeout=10**6)
    fresh = iter(range(1, 1 << 62))
    t = 0.0

    def new_prompt(n: int) -> list[int]:
        return [next(fresh) for _ in range(n)]

    def given(prompt: list[int]):
        return np.asarray(prompt, dtype=np.int64) if numpy_ids else prompt

    for _ in range(1000):  # compacted chains: placed, ended, then left waiting past compact_after
        p = grouper.place(t, None, given(new_prompt(ids)))
        grouper.end(p.task, p.index, t + 0.001, 10)
    t = 2000.0
    live: list[tuple[int, ...]] = []
    for _ in range(chains):
        prompt = new_prompt(ids)
        p = grouper.place(t, None, given(prompt))
        grouper.end(p.task, p.index, t, 10)
        live.append(tuple(prompt))
        t += 0.001
    took = {True: 0.0, False: 0.0}
    count = {True: 0, False: 0}
    for _ in range(calls):
        t += 0.001
        first = bool(rng.random() < first_share)
        k = int(rng.integers(len(live)))
        prev = live[k]
        prompt = new_prompt(ids) if first else list(prev[:len(prev) - int(rng.integers(0, 4))]) + new_prompt(int(rng.integers(4, 61)))
        ids_in = given(prompt)
        if not collect:
            gc.disable()
        started = time.perf_counter()
        p = grouper.place(t, None, ids_in)
        grouper.end(p.task, p.index, t + 0.0005, 10)
        took[first] += time.perf_counter() - started
        gc.enable()
        count[first] += 1
        live[k] = tuple(prompt if len(prompt) < 2 * ids else prompt[:ids])
    return took[False] / max(count[False], 1) * 1e6, took[True] / max(count[True], 1) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", nargs="+", default=["accept", "generated", "traces"],
                    choices=["accept", "generated", "traces"])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 2.0, 8.0], help="top-level tasks per second")
    ap.add_argument("--windows", type=float, nargs="+", default=[DEFAULT_SPAWN_WINDOW], help="spawn windows, s")
    ap.add_argument("--lag", type=float, default=0.002, help="mean client lag per send, s")
    ap.add_argument("--spawn-prob", type=float, default=0.04)
    ap.add_argument("--accept-spawn-prob", type=float, default=0.08)
    ap.add_argument("--system-prompt", type=int, default=0, help="tokens of a system prompt all tasks share")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--speed", action="store_true", help="only the cost per call at 300 live chains, 2,000-id prompts")
    args = ap.parse_args()
    if args.speed:
        print("us per call (place + end), 300 live chains, 2,000-id prompts, 1,000 compacted chains:")
        for label, numpy_ids, collect in (("ids as a list", False, True), ("ids as a list, GC paused", False, False),
                                          ("ids as a numpy array", True, True)):
            cont, first = speed(numpy_ids, collect, seed=args.seed)
            print(f"  {label:<26} continuing a chain {cont:6.1f}   first call of a chain {first:6.1f}")
        return

    head = f"{'workload':<10} {'rate/s':>7} {'window s':>8} {'keys':>4} {'calls':>6} {'tasks':>5} {'right':>7} " \
           f"{'subs found':>10} {'subs wrong':>10} {'us/call':>8} {'chains':>6} {'calls/s':>8} {'revised':>7}"
    print(head)
    for rate in args.rates:
        for name, workload, clock in workloads(args, rate):
            calls = replay(workload, clock, args.seed)
            evs = events(calls)
            span = max(c.end for c in calls) - min(c.send for c in calls)
            for window in args.windows:
                for keys in (False, True):
                    grouped = group(calls, evs, keys, spawn_window=window)
                    s = score(calls, grouped)
                    us, most = grouped.us_per_call, grouped.most_chains
                    print(f"{name:<10} {rate:>7g} {window:>8g} {'yes' if keys else 'no':>4} {len(calls):>6} "
                          f"{len(workload.tasks):>5} {100 * s['right']:>6.2f}% {s['found']:>4}/{s['subs']:<5} "
                          f"{s['wrong']:>4}/{s['made']:<5} {us:>8.1f} {most:>6} {len(calls) / span:>8.1f} {grouped.revisions:>7}", flush=True)


if __name__ == "__main__":
    main()
