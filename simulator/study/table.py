"""The study's terminal table, from study.json: one row per config, then the ranking's verdicts, the
twin's prediction, the config space, the failed points and the study's own overhead. Cells fold
instead of being cut, so a CI log keeps every number whole."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Console
from rich.table import Table


def _num(value: Optional[float], digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _money(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value >= 1:
        return f"${value:,.2f}"
    return f"${value:.3g}"


def _capacity(entry: dict[str, Any]) -> str:
    cap = entry.get("capacity")
    if not cap:
        return "-"
    if cap["per_min"] is None:
        if cap["status"] == "above_range" and cap.get("at_least_per_s"):
            return f">= {cap['at_least_per_s'] * 60:,.3g} (above range)"
        if cap["status"] == "below_range" and cap.get("at_most_per_s"):
            return f"< {cap['at_most_per_s'] * 60:,.3g} (below range)"
        return cap["status"].replace("_", " ")
    low, high = cap["ci_per_min"]
    return f"{cap['per_min']:,.3g} [{low:,.3g}, {high:,.3g}]"


def _quality(entry: dict[str, Any]) -> str:
    q = entry.get("quality")
    if not q:
        return "-"
    if q["status"] == "same":
        return f"same {q['identical_share']:.0%}"
    if q["status"] == "flagged":
        moved = f" dlogprob {q['mean_abs_logprob_delta']:.2g}" if q.get("reason") == "logprobs" else ""
        return f"FLAGGED {q['identical_share']:.0%}{moved}"
    return q["status"]


def _gpu(entry: dict[str, Any]) -> str:
    g = entry["gpu"]
    if not g["available"]:
        return "absent" if entry["kind"] != "twin" else "-"
    per_task = f", {g['joules_per_task']:,.0f} J/task" if g["joules_per_task"] is not None else ""
    return f"{g['memory_used_max_bytes'] / 2**30:,.1f} GiB, {g['utilisation_mean_perc']:.0f}%{per_task}"


def print_study(study: dict[str, Any], console: Console) -> None:
    """Print the table and the lines under it."""
    unit = study["ranking"]["unit"]
    table = Table(title=f"study {study['name']}: objective {study['objective']} ({unit}), "
                        f"CIs at {study['confidence']:.0%}")
    columns = ("rank", "config", "differs by", "tasks/h", "task p50 s", "task p95 s", "TTFT p95 ms",
               "capacity /min [CI]", "$/task self", "$/task API", "quality", "GPU", "reference tok/s", "objective")
    for name in columns:
        table.add_column(name, overflow="fold", justify="left" if name in ("config", "differs by", "GPU") else "right")
    for e in sorted(study["configs"], key=lambda e: (e["rank"] is None, e["rank"] or 0)):
        cost = e.get("cost") or {}
        ref = e.get("reference")
        obj = e["objective"]
        table.add_row(
            str(e["rank"] or "-"), e["name"] + (" (base)" if e["is_base"] else ""), e["differs_by"],
            _num(e["throughput_tasks_per_hour"]), _num(e["task_p50_s"], 2), _num(e["task_p95_s"], 2),
            _num(e["ttft_p95_ms"]), _capacity(e), _money(cost.get("self_hosted_per_task")),
            _money(cost.get("api_per_task")), _quality(e), _gpu(e),
            _num(ref["output_tokens_per_s"], 0) if ref else "-",
            "-" if obj["value"] is None else f"{obj['value']:,.4g}")
    console.print(table)
    for line in summary_lines(study):
        console.print(line, highlight=False, soft_wrap=True)


def summary_lines(study: dict[str, Any]) -> list[str]:
    """The lines under the table."""
    lines = [f"ranking: {' > '.join(study['ranking']['order'])}"]
    lines += [f"  {c['verdict']}" for c in study["ranking"]["comparisons"]]
    pred = study.get("twin_prediction")
    if pred:
        verdict = "the same order" if pred["same_order"] else "a different order"
        lines.append(f"twin ({pred['profile']}{', calibrated here' if pred['calibrated'] else ''}) predicts "
                     f"{' > '.join(pred['predicted_order'])}; measured {' > '.join(pred['measured_order'])}: {verdict}"
                     + (f"; {pred['note']}" if pred["note"] else ""))
    space = study.get("space")
    if space:
        ranks = ", ".join(f"{c['name']} predicted {c['predicted_rank']}"
                          + (f", measured {c['measured_rank']}" if c["measured_rank"] else "") for c in space["live"])
        lines.append(f"config space: {len(space['candidates'])} candidates on the twin; top {space['top_k']}: {ranks}")
    lines += [f"FAILED: {p['error']}" for p in study["failed_points"]]
    overhead = study["overhead"]
    if overhead["points"]:
        lines.append(f"study overhead per point (server start aside): mean {overhead['mean_s']:.3f} s, "
                     f"max {overhead['max_s']:.3f} s over {overhead['points']} points")
    return lines
