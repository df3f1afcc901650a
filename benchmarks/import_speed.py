"""How fast the importers read the shared public traces, and whether the time grows linearly.

For each trace (the whole Mooncake file, the Azure code file, the Weka Claude Code folder, and a
native JSONL conversion of the Weka folder) it imports the whole input and a copy cut to its first
half (half the lines, or half the files), best of `--repeat` runs each, and prints calls, seconds
and calls/s. Linearity is (time of half / time of whole) / (calls of half / calls of whole), and
the same with bytes instead of calls: about 1 when the time is proportional to the input. Calls
differ in size (a Claude Code call carries thousands of hash ids), so bytes are the fairer base there.

    .venv/bin/python benchmarks/import_speed.py [--traces ../shared/traces] [--repeat 3]

Target (issue): at least 100k calls/s for the CSV and JSONL formats.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from simulator.traces import load, native

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def best_time(path: Path, repeat: int, format: Optional[str] = None) -> tuple[float, int]:
    """Fastest of `repeat` imports of `path` and the calls it held."""
    best = float("inf")
    calls = 0
    for _ in range(repeat):
        workload = None  # free the previous import before the clock starts
        start = time.perf_counter()
        workload = load([path], format)
        best = min(best, time.perf_counter() - start)
        calls = workload.counts()[1]
    return best, calls


def half_lines(source: Path, target: Path, keep_header: bool) -> Path:
    """Copy `source` cut to its first half of data lines (the header line kept when asked)."""
    lines = source.read_bytes().splitlines(keepends=True)
    head, body = (lines[:1], lines[1:]) if keep_header else ([], lines)
    target.write_bytes(b"".join(head + body[: len(body) // 2]))
    return target


def half_files(source: Path, target: Path) -> Path:
    """Copy the first half of a folder's trace files (sorted by name) into `target`."""
    target.mkdir()
    files = sorted(p for p in source.iterdir() if p.suffix == ".json")
    for path in files[: len(files) // 2]:
        shutil.copy(path, target / path.name)
    return target


def size(path: Path) -> int:
    """Bytes of a file, or of the trace files in a folder."""
    return sum(p.stat().st_size for p in path.glob("*.json")) if path.is_dir() else path.stat().st_size


def report(name: str, whole: Path, make_half: Callable[[], Path], repeat: int, format: Optional[str] = None) -> None:
    """Time the whole input and its half; print one row."""
    t_full, n_full = best_time(whole, repeat, format)
    half = make_half()
    t_half, n_half = best_time(half, repeat, format)
    time_ratio = t_half / t_full
    by_calls = time_ratio / (n_half / n_full) if n_full and n_half else float("nan")
    by_bytes = time_ratio / (size(half) / size(whole))
    print(f"{name:<22} {n_full:>9,} {t_full:>8.3f} {n_full / t_full:>11,.0f} {size(whole) / 1e6 / t_full:>7.1f}   "
          f"{n_half:>9,} {t_half:>8.3f} {by_calls:>9.2f} {by_bytes:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="the shared traces folder")
    parser.add_argument("--repeat", type=int, default=3, help="imports per input (best is kept)")
    args = parser.parse_args()
    traces: Path = args.traces
    mooncake = traces / "mooncake" / "conversation_trace.jsonl"
    azure = traces / "azure-2023" / "AzureLLMInferenceTrace_code.csv"
    weka = traces / "weka-claude-code"

    print(f"{'trace':<22} {'calls':>9} {'s':>8} {'calls/s':>11} {'MB/s':>7}   "
          f"{'half calls':>9} {'half s':>8} {'lin/calls':>9} {'lin/bytes':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        report("mooncake (jsonl)", mooncake, lambda: half_lines(mooncake, tmp_dir / "mooncake.jsonl", False), args.repeat)
        report("azure (csv)", azure, lambda: half_lines(azure, tmp_dir / "azure.csv", True), args.repeat)
        report("claude-code (folder)", weka, lambda: half_files(weka, tmp_dir / "weka-half"), args.repeat)

        native_file = tmp_dir / "weka.jsonl"
        start = time.perf_counter()
        native.write(load([weka]), native_file)
        written = time.perf_counter() - start
        report("native (weka, jsonl)", native_file,
               lambda: half_lines(native_file, tmp_dir / "weka-half.jsonl", True), args.repeat)
        print(f"(weka -> native conversion: {written:.2f} s including the import, "
              f"{size(native_file) / 1e6:.1f} MB written)")


if __name__ == "__main__":
    main()
