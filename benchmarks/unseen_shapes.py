"""Traffic shapes drawn at random for checking the twin on traffic nobody tuned it against.

Each family takes one source of agent traffic the project ships (the recorded Claude Code sessions, the
fitted Claude Code workload model, the Azure code trace, the Mooncake conversation trace, TraceLab's
replay sessions) and draws its settings from a seeded generator: how many tasks, how fast and how
bursty they arrive, how the tokens are scaled to the tiny test model's 4,096-token context, how long
tool and think time lasts. A new `--shape-seed` gives shapes no earlier check has seen; the families
stay what the twin must serve (short single calls at recorded times, short turns over long shared
prefixes, overlapping multi-turn sessions with sub-agents, generated bursts).

    .venv/bin/python benchmarks/unseen_shapes.py OUT_DIR --shape-seed 5 [--count 6]   # write the scenarios
    .venv/bin/python benchmarks/twin_accuracy.py --unseen 6 --shape-seed 5              # and check the twin on them

Every shape is written as a scenario file (`OUT_DIR/<n>-<family>.yaml`) whose header says what was
drawn; `agentload simulate FILE -p PROFILE` and `agentload run FILE --set target.base_url=URL` take it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
CONTEXT_CAP = 3800
"""Most tokens of a call: the tiny test model serves 4,096."""


def _claude_code_overlay(rng: np.random.Generator) -> dict:
    """The seven recorded Claude Code sessions (one with four sub-agents), laid over themselves."""
    return {"trace": str(TRACES / "claude-code"),
            "transforms": {"rate_scale": int(rng.integers(2, 6)), "rate_mode": "overlay",
                           "token_scale": round(float(rng.uniform(0.025, 0.045)), 4), "context_cap": CONTEXT_CAP,
                           "gap_scale": round(float(rng.uniform(0.02, 0.2)), 3),
                           "gap_cap": round(float(rng.uniform(0.3, 2.0)), 2)},
            "stagger": round(float(rng.uniform(0.1, 1.0)), 2)}


def _generated_sessions(rng: np.random.Generator) -> dict:
    """Claude Code sessions generated from the fitted workload model, bursty arrivals."""
    return {"model": str(ROOT / "models" / "claude-code.yaml"),
            "generate": {"tasks": int(rng.integers(10, 25)), "rate": round(float(rng.uniform(0.5, 3.0)), 2),
                         "burstiness": round(float(rng.uniform(0.3, 3.0)), 2)},
            "transforms": {"token_scale": round(float(rng.uniform(0.02, 0.04)), 4), "context_cap": CONTEXT_CAP,
                           "gap_scale": round(float(rng.uniform(0.02, 0.1)), 3),
                           "gap_cap": round(float(rng.uniform(0.3, 1.5)), 2)}}


def _azure_recorded_times(rng: np.random.Generator) -> dict:
    """Single-call tasks of the Azure code trace at their recorded arrival times (a random subset,
    time-compressed to a run of 40-70 s)."""
    return {"trace": str(TRACES / "azure-2023"),
            "transforms": {"sample": int(rng.integers(100, 180)),
                           "time_scale": round(float(rng.uniform(40, 70)) / 271, 4),
                           "token_scale": round(float(rng.uniform(0.3, 0.7)), 3), "context_cap": CONTEXT_CAP}}


def _azure_gamma_bursts(rng: np.random.Generator) -> dict:
    """Single-call tasks of the Azure code trace re-spaced as bursty gamma arrivals."""
    return {"trace": str(TRACES / "azure-2023"),
            "transforms": {"sample": int(rng.integers(100, 200)), "rate": round(float(rng.uniform(3, 8)), 2),
                           "burstiness": round(float(rng.uniform(0.15, 0.6)), 3),
                           "token_scale": round(float(rng.uniform(0.2, 0.6)), 3), "context_cap": CONTEXT_CAP}}


def _mooncake_shared_prefixes(rng: np.random.Generator) -> dict:
    """The Mooncake conversation trace: sessions rebuilt from hash chains, short turns over long shared
    prefixes, at their recorded times compressed."""
    return {"trace": str(TRACES / "mooncake"),
            "transforms": {"token_scale": round(float(rng.uniform(0.1, 0.25)), 3), "context_cap": CONTEXT_CAP,
                           "time_scale": round(float(rng.uniform(0.2, 0.4)), 3)}}


def _tracelab_sessions(rng: np.random.Generator) -> dict:
    """TraceLab's replay sessions (multi-turn, 77% of prompt tokens from earlier turns)."""
    return {"trace": str(TRACES / "tracelab" / "multi_session_large.csv"),
            "transforms": {"rate_scale": round(float(rng.uniform(0.3, 1.2)), 3),
                           "token_scale": round(float(rng.uniform(0.25, 0.5)), 3), "context_cap": CONTEXT_CAP,
                           "gap_scale": round(float(rng.uniform(0.5, 3.0)), 2)}}


FAMILIES: dict[str, Callable[[np.random.Generator], dict]] = {
    "claude-code-overlay": _claude_code_overlay,
    "generated-sessions": _generated_sessions,
    "azure-recorded-times": _azure_recorded_times,
    "azure-gamma-bursts": _azure_gamma_bursts,
    "mooncake-shared-prefixes": _mooncake_shared_prefixes,
    "tracelab-sessions": _tracelab_sessions,
}


def write_shapes(folder: Path, seed: int, count: int = len(FAMILIES)) -> list[Path]:
    """`count` scenario files in `folder`, the families in turn, settings drawn from `seed`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    families = list(FAMILIES.items())
    paths = []
    for n in range(count):
        family, draw = families[n % len(families)]
        workload = draw(rng)
        name = f"{n}-{family}"
        scenario = {"name": f"unseen-{name}", "description": f"{FAMILIES[family].__doc__.split(chr(10))[0]}",
                    "workload": workload,
                    "target": {"base_url": "http://127.0.0.1:8000", "api": "completions", "vocab_size": 1024},
                    "run": {"seed": 0, "scrape_interval": 2.0}}
        path = folder / f"{name}.yaml"
        path.write_text(f"# drawn by benchmarks/unseen_shapes.py --shape-seed {seed} (shape {n}, family {family})\n"
                        + yaml.safe_dump(scenario, sort_keys=False))
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--shape-seed", type=int, required=True)
    parser.add_argument("--count", type=int, default=len(FAMILIES))
    args = parser.parse_args()
    for path in write_shapes(args.folder, args.shape_seed, args.count):
        print(path)


if __name__ == "__main__":
    main()
