"""Each replica's /metrics during a live fleet run: one probe per replica (a test scrape says whether it
has them), its samples appended to the result folder's ``fleet/<name>_metrics.jsonl`` as the run goes,
and at the end the fleet's section of the summary, built from each replica's timeline and the call
records (`simulator.metrics.fleet.fleet_figures`, as the twin's fleet builds it)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator, Callable, Optional

from ..live.probes import MetricsProbe
from ..live.scrape import scraping
from ..metrics import results
from ..metrics.fleet import FleetFigures, fleet_figures
from ..redact import Redactor, mask_url
from .launch import FLEET_DIR, Fleet


def metrics_file(name: str) -> str:
    """The file of a replica's scrapes, in the result folder's ``fleet/``."""
    return f"{name}_metrics.jsonl"


async def open_replica_probes(fleet: Fleet, interval: float, redact: Redactor) -> dict[str, Optional[MetricsProbe]]:
    """A /metrics probe per replica, None for one whose test scrape failed or found none of vLLM's
    metrics (its figures then come from the call records alone); `redact` cleans the errors kept."""
    probes: dict[str, Optional[MetricsProbe]] = {}
    for replica in fleet.replicas:
        probe = MetricsProbe(replica.url, interval_s=interval)
        sample = await probe.scrape_once()
        probes[replica.name] = probe if sample is not None and sample.values else None
    return probes


@contextlib.asynccontextmanager
async def scraping_replicas(probes: dict[str, Optional[MetricsProbe]], t0: float,
                            folder: Path) -> AsyncIterator[Optional[Callable[[], None]]]:
    """Scrape every replica that has /metrics while the block runs (`simulator.live.scrape.scraping`
    for each, into ``fleet/<name>_metrics.jsonl``); yields the call that appends the new samples."""
    logs = Path(folder) / FLEET_DIR
    logs.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        syncs = []
        for name, probe in probes.items():
            if probe is not None:
                syncs.append(await stack.enter_async_context(scraping(probe, t0, logs, metrics_file(name))))
        yield (lambda: [sync() for sync in syncs if sync is not None]) if syncs else None


def fleet_section(folder: Path, fleet: Fleet, probes: dict[str, Optional[MetricsProbe]],
                  redact: Redactor) -> FleetFigures:
    """The summary's ``fleet`` section of a live run in `folder`: each replica's scrapes summarized
    (`MetricsProbe.summary`, errors redacted) beside the call records; URLs masked."""
    timelines = {}
    for name, probe in probes.items():
        if probe is None:
            continue
        timeline = probe.summary()
        if timeline.get("last_error"):
            timeline["last_error"] = redact(timeline["last_error"])
        timelines[name] = timeline
    return fleet_figures(fleet.names, results.read_calls(folder), timelines, policy=fleet.policy,
                         urls={r.name: mask_url(r.url) for r in fleet.replicas}, router_url=mask_url(fleet.router_url),
                         died=fleet.died())
