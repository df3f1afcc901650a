"""The terminal lines of a sharded run's ``shards`` section: one a shard, under the usual summary."""

from __future__ import annotations

from typing import Any


def shard_line(shard: dict[str, Any]) -> str:
    """One shard: where it ran, its tasks, calls and tokens, its client lag, CPU and connections; or
    how it was lost."""
    lag = shard.get("client_lag_ms") or {}
    head = f"shard {shard['index']}" + (f" on {shard['host']}" if shard.get("host") else "")
    work = (f"{shard.get('tasks_started', 0)}/{shard['tasks']} tasks started, {shard['calls']} calls "
            f"({shard['calls_ok']} ok), {shard['output_tokens']} output tokens; client lag p50 "
            f"{lag.get('p50', 0.0):.2f} / p99 {lag.get('p99', 0.0):.2f} / max {lag.get('max', 0.0):.2f} ms")
    if shard.get("lost"):
        return (f"{head}: LOST ({shard.get('error')}), last heard {shard.get('last_heard_s', 0.0):.1f} s after "
                f"the start; {work}; its unfinished started tasks are counted failed (shard_lost)")
    waited = shard.get("cpu_wait_share")
    return (f"{head}: {work}; CPU {100 * shard['cpu_share']:.0f}% of a core (event loop "
            f"{100 * shard['loop_cpu_s'] / shard['wall_s'] if shard['wall_s'] else 0.0:.0f}%"
            + (f", waiting for a CPU {100 * waited:.0f}% of the time" if waited is not None else "") + "); "
            f"{shard['connections_warm']} connections opened ahead, {shard['connections_opened']} in all; "
            f"{shard['bodies_prepared']} bodies built ahead; ready {shard['start_ahead_ms']:.0f} ms before t0"
            + (f"; records copied from {shard['part']}" if shard.get("part") else ""))


def print_shards(summary: Any, console: Any) -> None:
    """Print the ``shards`` section of a sharded run's summary (nothing for a single-process one)."""
    shards = summary.to_dict().get("shards")
    if not shards:
        return
    console.print(f"shards: {len(shards)}", highlight=False, soft_wrap=True, markup=False)
    for shard in shards:
        console.print("  " + shard_line(shard), highlight=False, soft_wrap=True, markup=False)


def lost_verdict(summary: Any, verdict: Any) -> Any:
    """A run that lost a shard did not measure all it was asked to: exit code 1 (as for failed calls)
    when the verdict was 0, saying which shards."""
    from ..metrics.verdict import CALLS_FAILED, Verdict  # noqa: PLC0415

    lost = (summary.to_dict().get("ray") or {}).get("lost") or []
    if not lost or verdict.code != 0:
        return verdict
    return Verdict(CALLS_FAILED, f"shard(s) {', '.join(map(str, lost))} lost: their calls in flight are not done "
                                 "and their unfinished tasks are counted failed (shard_lost)")
