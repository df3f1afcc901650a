"""The target's /metrics during a live run: one test scrape decides whether it has them
(`open_probe`), the probe scrapes while the replay runs (`scraping`), and at the end the samples are
joined with the task records into the summary's ``server`` section (`server_summary`)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional

from ..metrics import server as server_metrics
from ..redact import Redactor, mask_url
from ..scenario import Scenario
from .probes import MetricsProbe


@contextlib.asynccontextmanager
async def scraping(probe: Optional[MetricsProbe], t0: float, folder: Path,
                   name: str = server_metrics.SERVER_METRICS_FILE) -> AsyncIterator[Optional[Callable[[], None]]]:
    """Scrape /metrics while the block runs, appending the samples to server_metrics.jsonl (or `name`
    in `folder`); yields the call that appends the new samples (None without a probe)."""
    if probe is None:
        yield None
        return
    # the probe keeps time on time.monotonic: give it the run's t0 on that clock
    probe.t0 = time.monotonic() - (time.perf_counter() - t0)
    # nothing was sent since the test scrape: it is the counters' baseline at t = 0
    probe.samples[:] = [dataclasses.replace(probe.samples[-1], t=0.0)]
    log = server_metrics.SampleLog(folder, name)
    await probe.start()
    try:
        yield lambda: log.sync(probe.samples)
    finally:
        await probe.stop()
        log.sync(probe.samples)
        log.close()


async def open_probe(scenario: Scenario, root: str, redact: Redactor) -> tuple[Optional[MetricsProbe], Optional[str]]:
    """A /metrics probe for the target when it has /metrics (one test scrape), else (None, why not:
    the URL masked, the error's text `redact`ed)."""
    spec = scenario.target
    if spec is not None and not spec.metrics:
        return None, "server metrics off (target.metrics: false)"
    probe = MetricsProbe(root, interval_s=scenario.run.scrape_interval, gpu=spec is not None and spec.gpu_metrics)
    if await probe.scrape_once() is None:
        where = "the built-in emulator has none" if spec is None else f"GET {mask_url(probe.url)} failed"
        why = redact(probe.last_error or "").removeprefix("ValueError: ")  # type: ignore[union-attr]
        return None, f"no server metrics: {where} ({why})"
    if not probe.samples[0].values:
        return None, f"no server metrics: {mask_url(probe.url)} has none of the vLLM metrics tracked"
    return probe, None


def server_summary(folder: Path, probe: Optional[MetricsProbe], note: Optional[str],
                   tally: server_metrics.ServerTally, interval: float, redact: Redactor) -> dict[str, Any]:
    """Join the scrapes with the task records, write server_tasks.jsonl, return the summary section
    (`simulator.metrics.server.summarize`); a scrape error is redacted first."""
    if probe is None:
        return server_metrics.summarize(folder, tally, None, note=note)
    timeline = probe.summary()
    if timeline.get("last_error"):
        timeline["last_error"] = redact(timeline["last_error"])
    return server_metrics.summarize(folder, tally, probe.samples, timeline, interval_s=interval,
                                    note=note or probe.gpu_note)
