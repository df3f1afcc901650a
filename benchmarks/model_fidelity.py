"""Fidelity of the workload model: fit on half the shared Claude Code sessions, generate, compare with
the other half; and arrivals fitted on the Azure code trace, index of dispersion generated vs recorded.

The halves are stratified by session length (see `_split`): sessions sorted by number of calls,
neighbours paired, one of each pair to each half by the seed. A plain random split lets a few very
long sessions land in one half and decide the per-call marginals. Beside each row the same comparison
between the two real halves is printed: the floor that a model fitted on one half can reach.

Run: .venv/bin/python benchmarks/model_fidelity.py [--seed 0] [--tasks 1000]
Targets (issue): per-call marginals KS <= 0.08 (appended, output tokens, gaps), calls per task KS <= 0.2,
p99 ratios within 0.7-1.4; Azure index of dispersion at 1/10/60 s within 25 % of recorded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from simulator.model.arrivals import fit_arrivals
from simulator.model.fidelity import compare_workloads
from simulator.model.fit import fit_model
from simulator.model.generate import generate
from simulator.stats import DISPERSION_WINDOWS, index_of_dispersion
from simulator.traces import load
from simulator.workload import Workload

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
TARGETS = {"appended_tokens": 0.08, "output_tokens": 0.08, "gaps_s": 0.08, "calls_per_task": 0.2}


def _split(whole: Workload, seed: int) -> tuple[Workload, Workload]:
    """Two halves of the sessions, stratified by length (a matched-pair split): the sessions are sorted
    by number of calls, neighbours are paired, and the seed sends one of each pair to each half. A plain
    random permutation of 130 sessions now and then puts most of the few 60-80-call sessions in one
    half, and since those carry a large share of all calls they decide the per-call marginals: the
    halves then differ by more than any model could be asked to bridge. Pairing keeps both halves with
    the same mix of long and short sessions and leaves everything else to chance. With an odd count the
    longest session goes to the fitted half."""
    rng = np.random.default_rng(seed)
    order = sorted(range(len(whole.tasks)), key=lambda i: (len(whole.tasks[i].calls), whole.tasks[i].id))
    fit_idx, held_idx = [], []
    for j in range(0, len(order) - 1, 2):
        a, b = order[j], order[j + 1]
        if rng.random() < 0.5:
            a, b = b, a
        fit_idx.append(a)
        held_idx.append(b)
    if len(order) % 2:
        fit_idx.append(order[-1])
    pick = lambda idx: Workload(tuple(whole.tasks[i] for i in sorted(idx)), whole.provenance)
    return pick(fit_idx), pick(held_idx)


def _meets(m, target: float) -> bool:
    """KS within `target` and the p99 ratio within 0.7-1.4."""
    return m.ks is not None and m.ks <= target and m.p99_ratio is not None and 0.7 <= m.p99_ratio <= 1.4


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def claude_code(seeds: list[int], tasks: int) -> bool:
    whole = load([SHARED / "weka-claude-code"])
    ok = True
    for seed in seeds:
        train, held = _split(whole, seed)
        model = fit_model(train, allow_fallback=True)
        synthetic = generate(model, tasks=tasks, seed=seed, rate=0.01)
        result = compare_workloads(held, synthetic)
        floor = {m.name: m for m in compare_workloads(held, train).marginals}
        print(f"Claude Code, split seed {seed}: fit on {len(train.tasks)} sessions, "
              f"{tasks} generated vs {len(held.tasks)} held out")
        print(f"{'marginal':<18}{'KS':>7}{'target':>7}{'p50':>7}{'p90':>7}{'p99':>7}  ok   "
              f"| fit half vs held-out half: KS, p99")
        for m in result.marginals:
            target = TARGETS.get(m.name)
            base = floor[m.name]
            fine = target is None or _meets(m, target)
            ok &= fine
            # NO*: the two real halves miss the same target, so no model fitted on one half could meet it.
            mark = "" if target is None else ("yes" if fine else ("NO*" if not _meets(base, target) else "NO"))
            print(f"{m.name:<18}{_fmt(m.ks):>7}{'-' if target is None else target:>7}{_fmt(m.p50_ratio):>7}"
                  f"{_fmt(m.p90_ratio):>7}{_fmt(m.p99_ratio):>7}  {mark:<4} | {_fmt(base.ks):>6} {_fmt(base.p99_ratio):>6}")
        print()
    return ok


def azure(seed: int) -> bool:
    recorded = np.sort(np.asarray([t.arrival for t in load([SHARED / "azure-2023"]).tasks]))
    recorded -= recorded[0]
    fit = fit_arrivals(recorded)
    print(f"Azure code arrivals: {len(recorded)} over {recorded[-1]:.0f} s; AIC picks {fit.use}")
    for c in fit.candidates:
        print(f"  {c.kind:<10} params {c.params:>3}  loglik {c.loglik:>12.1f}  AIC {c.aic:>12.1f}")
    print(f"{'process':<12}" + "".join(f"{f'IDC {w:g}s':>12}" for w in DISPERSION_WINDOWS) + "  (generated / recorded)")
    ok = True
    for name, proc in fit.processes.items():
        gen = proc.sample(np.random.default_rng(seed), duration=float(recorded[-1]))
        ratios = [index_of_dispersion(gen, w) / index_of_dispersion(recorded, w) for w in DISPERSION_WINDOWS]
        fine = all(0.75 <= r <= 1.25 for r in ratios)
        if name == fit.use:
            ok &= fine
        print(f"{name + (' *' if name == fit.use else ''):<12}" + "".join(f"{r:>12.2f}" for r in ratios) + f"  {'yes' if fine else 'NO'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="first split seed")
    ap.add_argument("--splits", type=int, default=3, help="how many seeded splits to run")
    ap.add_argument("--tasks", type=int, default=1000)
    args = ap.parse_args()
    a = claude_code(list(range(args.seed, args.seed + args.splits)), args.tasks)
    b = azure(args.seed)
    print(f"\nClaude Code targets met on every split: {a}; Azure dispersion targets met (selected process): {b}")
    print("The right-hand columns are the floor a model fitted on one half can reach: the two halves of")
    print("65 sessions differ from each other by that much. NO*: the real halves miss that target too.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
