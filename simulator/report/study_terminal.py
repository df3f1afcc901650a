"""A study's ranking in the terminal: the same rows as the HTML page's ranking table."""

from __future__ import annotations

from rich import box
from rich.table import Table

from .cells import number
from .study import OBJECTIVE_LABELS, Study


def study_table(study: Study) -> Table:
    """One row per config, best first: rank, objective, capacity with its CI, figures, cost, quality."""
    table = Table(title=f"Study {study.name}: ranked by {OBJECTIVE_LABELS.get(study.objective, study.objective)}",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (("rank", "right"), ("config", "left"), ("objective", "right"), ("capacity tasks/h", "right"),
                          ("CI", "right"), ("p95 task s", "right"), ("p95 TTFT ms", "right"),
                          ("$/task self", "right"), ("$/task API", "right"), ("quality", "left")):
        table.add_column(name, justify=justify)
    for c in sorted(study.configs, key=lambda c: (c.rank is None, c.rank or 0)):
        cap = c.capacity
        ci = cap.ci_per_hour if cap else None
        quality = "-" if c.quality is None else ("CHANGED" if c.quality.flagged else c.quality.status or "-")
        table.add_row("-" if c.rank is None else str(c.rank), c.name, number(c.objective.value),
                      number(cap.per_hour if cap else None), f"{number(ci[0])}-{number(ci[1])}" if ci else "-",
                      number(c.task_p95_s), number(c.ttft_p95_ms), number(c.cost.self_hosted_per_task if c.cost else None),
                      number(c.cost.api_per_task if c.cost else None), quality)
    if study.failed_points:
        table.caption = f"{len(study.failed_points)} point(s) failed; see the HTML report or study.json"
    return table
