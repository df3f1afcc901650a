"""The fleet's twin against a live fleet: does the router model route as sglang-router does?

For each router policy, the same scenario runs live (replicas of the built-in emulator, each serving the
twin of a fixed-timing profile in real time, behind a launched sglang-router) and on the twin's fleet
(the same profile per replica, the router policy's model). The replicas' server model is the same on both
sides, so what differs is the router. Printed per policy:

- each replica's share of the calls, live and twin, ranked (replicas are interchangeable, so the busiest
  is compared with the busiest), and the largest difference in points (target ≤ 5);
- the fleet's prefix-cache hit share, live and twin, and the difference in points (target ≤ 5);
- task p50 and p95, live and twin, and twin/live (target within 10%).

    python benchmarks/fleet_accuracy.py                       # scenarios/fleet/claude-code.yaml
    python benchmarks/fleet_accuracy.py --repeat 2 --policies round_robin manual

Needs sglang-router (pip install 'agentload[fleet]'). A live run takes about a minute per policy; run
it on a quiet machine (the emulators time in real time on the same CPUs as the router and the client).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "fleet" / "claude-code.yaml"
POLICIES = ("round_robin", "cache_aware", "manual")
POLICY_SETTINGS = {"manual": ["fleet.router.assignment_mode=min_group"]}
"""Per policy, settings of both runs: `manual` places new session keys on the replica with the fewest
keys in flight, not at random (the default), since a random placement is drawn apart live and on the twin
and its shares would differ by chance, not by the model."""
AGENTLOAD = [sys.executable, "-m", "simulator"]
SHARE_POINTS = 5.0
HIT_POINTS = 5.0
TASK_RATIO = 0.10


def run(kind: str, scenario: Path, policy: str, out: Path, settings: list[str]) -> dict:
    """One run (`run` live or `simulate` on the twin) of `scenario` with `policy`; its summary.json."""
    sets = [arg for s in [f"fleet.router.policy={policy}", *settings] for arg in ("--set", s)]
    command = [*AGENTLOAD, kind, str(scenario), "-o", str(out), *sets]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def shares(summary: dict) -> list[float]:
    """The replicas' shares of the calls, largest first, in percent."""
    return sorted((100.0 * (r.get("call_share") or 0.0) for r in summary["fleet"]["replicas"]), reverse=True)


def figures(summary: dict) -> dict:
    fleet = summary["fleet"]
    times = summary["tasks"]["completion_time_s"]
    return {"shares": shares(summary), "hit": 100.0 * (fleet.get("prefix_hit_share") or 0.0),
            "p50": times["p50"], "p95": times["p95"], "accounted": fleet.get("accounted"),
            "moved": fleet["moves"].get("moved_share")}


def mean_of(runs: list[dict]) -> dict:
    """The figures of repeated runs, averaged (shares rank by rank)."""
    out = {key: statistics.fmean(r[key] for r in runs) for key in ("hit", "p50", "p95")}
    out["shares"] = [statistics.fmean(col) for col in zip(*(r["shares"] for r in runs))]
    out["accounted"] = all(r["accounted"] for r in runs)
    out["moved"] = statistics.fmean(r["moved"] or 0.0 for r in runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--repeat", type=int, default=1, help="live runs per policy (averaged)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        help="a scenario override for every run, e.g. fleet.router.assignment_mode=min_group")
    parser.add_argument("-o", "--out", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="agentload-fleet-accuracy-"))
    met = total = 0
    print(f"scenario {args.scenario.relative_to(REPO) if args.scenario.is_relative_to(REPO) else args.scenario}; "
          f"runs in {out}")
    for policy in args.policies:
        settings = [*POLICY_SETTINGS.get(policy, []), *args.settings]
        live = mean_of([figures(run("run", args.scenario, policy, out / f"{policy}-live-{i}", settings))
                        for i in range(args.repeat)])
        twin = figures(run("simulate", args.scenario, policy, out / f"{policy}-twin", settings))
        share_gap = max(abs(a - b) for a, b in zip(live["shares"], twin["shares"]))
        hit_gap = abs(live["hit"] - twin["hit"])
        ratios = {q: twin[q] / live[q] for q in ("p50", "p95")}
        checks = [share_gap <= SHARE_POINTS, hit_gap <= HIT_POINTS, *(abs(r - 1) <= TASK_RATIO for r in ratios.values())]
        met += sum(checks)
        total += len(checks)
        print(f"\n{policy} {' '.join(POLICY_SETTINGS.get(policy, []))} (every call accounted live: {live['accounted']}; tasks that moved: "
              f"live {100 * live['moved']:.1f}%, twin {100 * (twin['moved'] or 0):.1f}%)")
        print(f"  call shares, ranked (%)  live {' '.join(f'{s:.1f}' for s in live['shares'])}  "
              f"twin {' '.join(f'{s:.1f}' for s in twin['shares'])}  largest gap {share_gap:.1f} points"
              f"  {'ok' if checks[0] else 'MISS'}")
        print(f"  prefix-hit share (%)     live {live['hit']:.1f}  twin {twin['hit']:.1f}  gap {hit_gap:.1f} points"
              f"  {'ok' if checks[1] else 'MISS'}")
        for (q, ratio), ok in zip(ratios.items(), checks[2:]):
            print(f"  task {q} (s)            live {live[q]:.3f}  twin {twin[q]:.3f}  twin/live {ratio:.3f}"
                  f"  {'ok' if ok else 'MISS'}")
    print(f"\n{met} of {total} figures within their targets (shares and hit share ±{SHARE_POINTS:g} points, "
          f"task p50/p95 ±{100 * TASK_RATIO:g}%)")
    return 0 if met == total else 1


if __name__ == "__main__":
    sys.exit(main())
