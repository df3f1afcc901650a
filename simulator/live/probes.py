"""Server-side metrics during a live run: scrape vLLM's Prometheus /metrics on a fixed schedule.

`MetricsProbe` keeps a time series (seconds since the run's t0) of queue depths, KV-cache usage
and the prefix-cache, preemption, token and speculative-decoding counters; it writes them to
``server_metrics.jsonl`` and summarizes them (`simulator.metrics.server` joins them with the tasks).
Optional NVML sampling
adds GPU utilization, memory and board power when nvidia-ml-py and a GPU are there (the power gives the
run's energy: `simulator.metrics.energy`).

A failed scrape is counted and the series goes on; it never stops the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ..metrics.energy import POWER_SUFFIX
from ..metrics.server import COUNTERS, GAUGES, GPU_PREFIX, Sample, timeline_summary

RESULT_FILE = "server_metrics.jsonl"


TRACKED = frozenset(name for names in (*GAUGES.values(), *COUNTERS.values()) for name in names)
"""Every sample name we read."""


def parse_metrics(text: str) -> dict[str, float]:
    """The values we track from one Prometheus text exposition, by our names; absent ones left out.

    Only the tracked samples' lines reach the parser: vLLM's exposition is mostly histogram buckets
    (~55 KB), whose parsing would hold the run's event loop for ~15 ms a scrape and delay the
    timestamps of the tokens arriving meanwhile. Raises ValueError when those lines cannot be parsed.
    """
    lines = [line for line in text.splitlines()
             if line.startswith("vllm:") and line.partition("{")[0].partition(" ")[0] in TRACKED]
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name.startswith("vllm:"):
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    values: dict[str, float] = {}
    for ours, names in (*GAUGES.items(), *COUNTERS.items()):
        for name in names:
            if name in sums:
                values[ours] = sums[name]
                break
    return values


@dataclass
class MetricsProbe:
    """Scrape ``{base_url}/metrics`` every `interval_s` seconds on an absolute schedule.

    `t0` is the run's start on the ``time.monotonic()`` clock; sample times are seconds since it.
    Use ``async with`` (or `start` / `stop`); `stop` takes one last sample so short runs have an end.
    """

    base_url: str
    interval_s: float = 1.0
    t0: float = field(default_factory=time.monotonic)
    gpu: bool = False
    timeout_s: float = 5.0
    samples: list[Sample] = field(default_factory=list)
    failures: int = 0
    last_error: Optional[str] = None
    gpu_note: Optional[str] = None

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self._task: Optional[asyncio.Task] = None
        self._session: Optional[aiohttp.ClientSession] = None
        self._nvml = None
        self._gpu_handles: list = []

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/metrics"

    async def start(self) -> "MetricsProbe":
        """Open the HTTP session (and NVML if asked) and start the scraping task."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if self.gpu:
            self._open_nvml()
        self._task = asyncio.create_task(self._run(), name="metrics-probe")
        return self

    async def stop(self) -> None:
        """Stop the schedule, take a last sample, close the session."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._session is not None:
            await self.scrape_once()
            await self._session.close()
            self._session = None
        self._close_nvml()

    async def __aenter__(self) -> "MetricsProbe":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _run(self) -> None:
        start = time.monotonic()
        tick = 0
        while True:
            await self.scrape_once()
            # Next slot on the absolute grid; slots missed by a slow scrape are skipped, not bunched.
            tick = max(tick + 1, math.ceil((time.monotonic() - start) / self.interval_s))
            await asyncio.sleep(max(0.0, start + tick * self.interval_s - time.monotonic()))

    async def scrape_once(self) -> Optional[Sample]:
        """One scrape now; appends and returns the sample, or counts a failure and returns None."""
        own_session = self._session is None
        session = self._session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        t = time.monotonic() - self.t0
        try:
            async with session.get(self.url) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            values = parse_metrics(text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure of one scrape is data, never fatal
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            if own_session:
                await session.close()
        values.update(self._gpu_values())
        sample = Sample(round(t, 6), values)
        self.samples.append(sample)
        return sample

    def _open_nvml(self) -> None:
        try:
            import pynvml  # nvidia-ml-py, optional

            pynvml.nvmlInit()
            self._gpu_handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as exc:  # no package, no driver or no GPU: skip GPU sampling
            self._nvml = None
            self.gpu_note = f"GPU sampling off: {type(exc).__name__}: {exc}"

    def _close_nvml(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def _gpu_values(self) -> dict[str, float]:
        if self._nvml is None:
            return {}
        values: dict[str, float] = {}
        try:
            for i, handle in enumerate(self._gpu_handles):
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                values[f"{GPU_PREFIX}{i}_util_perc"] = float(util.gpu)
                values[f"{GPU_PREFIX}{i}_mem_used_bytes"] = float(mem.used)
                try:  # board power, which some GPUs do not report: the run's energy (`metrics.energy`)
                    values[f"{GPU_PREFIX}{i}{POWER_SUFFIX}"] = self._nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                except Exception:
                    pass
        except Exception as exc:
            self.gpu_note = f"GPU sample failed: {type(exc).__name__}: {exc}"
        return values

    def write(self, result_dir: str | Path) -> Path:
        """Write the samples as ``server_metrics.jsonl`` (one ``{"t": ..., name: value}`` per line)."""
        path = Path(result_dir) / RESULT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            for s in self.samples:
                fh.write(json.dumps({"t": s.t, **s.values}) + "\n")
        return path

    def summary(self) -> dict:
        """Gauges: mean and max over samples; counters: increase over the run; prefix-cache hit share
        (`simulator.metrics.server.timeline_summary`), with the last scrape error and the GPU note."""
        timeline = timeline_summary(self.samples, self.failures)
        head = {key: timeline.pop(key) for key in ("samples", "failed_scrapes")}
        if self.last_error:
            head["last_error"] = self.last_error
        out = {**head, **timeline}
        if self.gpu_note:
            out["gpu_note"] = self.gpu_note
        return out
