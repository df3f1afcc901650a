"""Do refactors leave every result file as it was? Runs a fixed set of commands into a folder
(`capture`), and compares two such folders (`compare`): the twin's outputs byte for byte but for what
names the moment or the place of a run (wall-clock stamps, result paths), the live outputs (whose times
are measured, so differ run to run) in all that does not depend on the clock: every file's fields, the
accounting, and each call's identity and token counts.

    .venv/bin/python benchmarks/identity.py capture /tmp/before      # on the old code
    .venv/bin/python benchmarks/identity.py capture /tmp/after       # on the new code
    .venv/bin/python benchmarks/identity.py compare /tmp/before /tmp/after

Capturing twice on the same code and comparing shows the comparison itself holds (nothing volatile
left in). The set: three scenarios on the twin, a live run against the built-in emulator, the same run
sharded on a local Ray cluster, a study on the twin with a load sweep and a capacity search, and
`agentload sweep` on the twin. About three minutes on two CPUs.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AGENTLOAD = [sys.executable, "-m", "simulator"]

LIVE_SCENARIO = f"""\
name: identity-live
workload:
  trace: {ROOT / "traces" / "claude-code"}
  transforms: {{token_scale: 0.04, context_cap: 4096, gap_scale: 0.01, gap_cap: 0.05}}
  stagger: 0.2
emulator: {{ttft: 0.005, itl: 0.001}}
run: {{seed: 3}}
slo:
  task_s: {{p90: 5}}
"""

CASES: dict[str, tuple[str, list[str]]] = {
    # name: (kind, agentload arguments; OUT is the case's folder, LIVE the live scenario file)
    "sim-quickstart": ("twin", ["simulate", "scenarios/quickstart.yaml", "-p", "tiny-vllm-cpu", "-o", "OUT"]),
    "sim-azure": ("twin", ["simulate", "scenarios/azure-bursty.yaml", "-p", "tiny-vllm-cpu", "-o", "OUT"]),
    "sim-gb300": ("twin", ["simulate", "scenarios/gb300-agents.yaml", "-p", "gb300-nemotron-super-default",
                           "--set", "run.max_tasks=40", "-o", "OUT"]),
    "live": ("live", ["run", "LIVE", "--no-progress", "-o", "OUT"]),
    "sharded": ("live", ["run", "LIVE", "--no-progress", "--ray", "-o", "OUT"]),
    "study": ("twin", ["study", "studies/vllm-cpu.yaml", "--twin", "--set", "repeats=1", "-o", "OUT"]),
    "sweep": ("twin", ["sweep", "scenarios/quickstart.yaml", "-p", "tiny-vllm-cpu", "--points", "3", "-o", "OUT"]),
}

WORK = Path(tempfile.gettempdir()) / "agentload-identity"
VOLATILE_KEYS = {"started_at", "finished_at", "wall_seconds", "run_s", "overhead_s", "base_url"}
"""Keys whose values name the moment of a run, its wall-clock time (a study's `overhead` too) or the
port the emulator took: left out of every comparison."""
VOLATILE_FILES = {"marker"}
"""Files holding a run's random token (a sharded run's marker)."""


def capture(out: Path, only: list[str]) -> None:
    """Each case run in one fixed folder (results name their own paths, and a sweep's fingerprints hash
    them), then moved under `out`; one capture at a time on a machine (a lock beside that folder)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(f"{WORK}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _capture(out, only)


def _capture(out: Path, only: list[str]) -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    live = WORK / "live-scenario.yaml"
    live.write_text(LIVE_SCENARIO)
    exits = {}
    for name, (_, args) in CASES.items():
        if only and name not in only:
            continue
        folder = WORK / name
        command = AGENTLOAD + [str(folder) if a == "OUT" else str(live) if a == "LIVE" else a for a in args]
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        (out / f"{name}.log").write_text(done.stdout + done.stderr)
        exits[name] = done.returncode
        shutil.rmtree(out / name, ignore_errors=True)
        if folder.exists():
            shutil.move(folder, out / name)
        print(f"{name}: exit {done.returncode}, {time.perf_counter() - began:.1f} s", flush=True)
    (out / "exits.json").write_text(json.dumps(exits, indent=1))


def strip(value: Any, live: bool) -> Any:
    """`value` without volatile keys; on a live case every float (a measured time or a figure made of
    times) and every list of numbers (a time series) reduced to its kind."""
    if isinstance(value, dict):
        return {k: strip(v, live) for k, v in value.items() if k not in VOLATILE_KEYS and k != "overhead"}
    if isinstance(value, list):
        if live and value and all(isinstance(v, (int, float)) for v in value):
            return "numbers"
        return [strip(v, live) for v in value]
    if live and (isinstance(value, float) or isinstance(value, str) and value.startswith("HIST")):
        return "measured"  # a time, a figure made of times, an encoded histogram of times
    return value


def read(path: Path, live: bool) -> Any:
    """A result file as compared: JSON and JSONL parsed and stripped (a live case's JSONL as the
    sorted set of its stripped lines, which arrive in measured order), other files as bytes."""
    if path.suffix == ".json":
        return strip(json.loads(path.read_text()), live)
    if path.suffix == ".jsonl":
        lines = [strip(json.loads(line), live) for line in path.read_text().splitlines() if line.strip()]
        if live:
            return sorted(json.dumps(line, sort_keys=True) for line in lines if not _is_series(line))
        return lines
    if live and path.suffix in {".html", ".png", ".csv", ".txt"}:
        return "present"
    return path.read_bytes()


def _is_series(line: Any) -> bool:
    """A line of a time series (a server-metrics scrape, a per-second tally): how many there are
    depends on the clock."""
    return isinstance(line, dict) and ("t" in line or "time" in line) and "task_id" not in line


def where(old: Any, new: Any, path: str = "") -> str:
    """The path of the first place where two compared values differ, and the values there."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            if old.get(key, "<absent>") != new.get(key, "<absent>"):
                return where(old.get(key, "<absent>"), new.get(key, "<absent>"), f"{path}.{key}")
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for k, (x, y) in enumerate(zip(old, new)):
            if x != y:
                return where(x, y, f"{path}[{k}]")
    return f"{path or '(whole)'}: {str(old)[:80]} | {str(new)[:80]}"


def compare(before: Path, after: Path) -> int:
    differences = 0
    exits = [json.loads((folder / "exits.json").read_text()) for folder in (before, after)]
    for name in exits[1]:  # the cases captured after (a capture --only has some)
        kind = CASES[name][0]
        if exits[0].get(name) != exits[1][name]:
            print(f"{name}: exit code {exits[0].get(name)} before, {exits[1][name]} after")
            differences += 1
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            print(f"{name}: no result folder {'before' if not a.exists() else 'after'}")
            differences += 1
            continue
        files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
        files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
        for extra in sorted(files_a ^ files_b):
            print(f"{name}: {extra} only {'before' if extra in files_a else 'after'}")
            differences += 1
        same = 0
        for rel in sorted(files_a & files_b):
            if rel.name in VOLATILE_FILES:
                continue
            old, new = read(a / rel, kind == "live"), read(b / rel, kind == "live")
            if old != new:
                print(f"{name}: {rel} differs at {where(old, new)}")
                differences += 1
            else:
                same += 1
        print(f"{name}: {same} files identical ({kind})")
    print("identical" if not differences else f"{differences} differences")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="run the set of commands into a folder")
    cap.add_argument("folder", type=Path)
    cap.add_argument("--only", nargs="*", default=[], choices=list(CASES), help="only these cases")
    cmp = sub.add_parser("compare", help="compare two captured folders")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.folder, args.only)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
