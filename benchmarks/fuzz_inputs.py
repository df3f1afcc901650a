"""Fuzz every trace importer, folders of mixed formats and the scenario loader; count the outcomes.

Runs N cases (default 110,000), spread evenly over the kinds (each format, a folder, a scenario with
--set overrides), each a seed mutated by tests/input_fuzzing.py with a `random.Random` seeded by
(--seed, kind, case number), so any case can be run again. Prints, per kind and in all, how many cases
ended in each outcome: a sound workload, an InputError, a workload that loaded but is not sound, or
another exception. The last two must be 0; the first cases of each are printed with their seeds.

    .venv/bin/python benchmarks/fuzz_inputs.py [--cases 110000] [--seed 0] [--kinds native,scenario]
    .venv/bin/python benchmarks/fuzz_inputs.py --replay scenario 0-scenario-123   # one case again
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from input_fuzzing import OUTCOMES, Fuzzer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=110_000, help="cases in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", help="comma-separated kinds (default: all)")
    parser.add_argument("--replay", nargs=2, metavar=("KIND", "CASE_SEED"), help="run one case and print its outcome")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fuzzer = Fuzzer(Path(tmp))
        if args.replay:
            kind, case_seed = args.replay
            outcome = fuzzer.case(kind, random.Random(case_seed))
            print(outcome.kind, outcome.detail)
            return
        kinds = args.kinds.split(",") if args.kinds else fuzzer.kinds()
        per_kind = -(-args.cases // len(kinds))
        counts: dict[str, collections.Counter] = {kind: collections.Counter() for kind in kinds}
        failures: list[str] = []
        start = time.perf_counter()
        for kind in kinds:
            began = time.perf_counter()
            for i in range(per_kind):
                case_seed = f"{args.seed}-{kind}-{i}"
                outcome = fuzzer.case(kind, random.Random(case_seed))
                counts[kind][outcome.kind] += 1
                if outcome.kind in ("invalid", "other") and len(failures) < 50:
                    failures.append(f"  {kind} {case_seed}: {outcome.kind}: {outcome.detail}")
            print(f"{kind:<14} {per_kind:>8,} cases in {time.perf_counter() - began:7.1f} s: "
                  + ", ".join(f"{name} {counts[kind][name]:,}" for name in OUTCOMES), flush=True)
        total = sum(counts.values(), collections.Counter())
        print(f"{'all':<14} {sum(total.values()):>8,} cases in {time.perf_counter() - start:7.1f} s: "
              + ", ".join(f"{name} {total[name]:,}" for name in OUTCOMES))
        print("  valid: a sound workload; input_error: a clean InputError; invalid: loaded but not sound; "
              "other: any other exception")
        if failures:
            print("failures (replay with --replay KIND CASE_SEED):")
            print("\n".join(failures))
            sys.exit(1)


if __name__ == "__main__":
    main()
