"""GPU memory, utilisation and energy during a live point, through NVML (the ``gpu`` extra:
nvidia-ml-py), for servers on this machine. Without the package, a driver or a GPU, `open_sampler`
says why and the study reports the figures as absent.

Energy is the driver's total-energy counter read before and after the point (Volta and later); where a
GPU has no such counter, power samples are integrated over the sampling interval instead.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

INTERVAL_S = 0.5


@dataclass
class GpuFigures:
    """One point's GPU figures, summed over the GPUs (memory, energy) or averaged (utilisation)."""

    memory_used_max_bytes: float
    utilisation_mean_perc: float
    energy_j: float
    gpus: int
    energy_source: str
    """'counter' (the driver's energy counter) or 'power samples'."""

    def to_dict(self) -> dict[str, Any]:
        """The figures as a point in study.json holds them."""
        return {"memory_used_max_bytes": self.memory_used_max_bytes, "utilisation_mean_perc": self.utilisation_mean_perc,
                "energy_j": self.energy_j, "gpus": self.gpus, "energy_source": self.energy_source}


class GpuSampler:
    """Samples every GPU in a thread between `start` and `stop`."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._memory_max = 0.0
        self._util: list[float] = []
        self._power_j = 0.0
        self._energy_start: Optional[list[int]] = None

    def start(self) -> None:
        """Begin sampling (the energy counters are read now)."""
        self._stop.clear()
        self._memory_max, self._util, self._power_j = 0.0, [], 0.0
        self._energy_start = self._energy()
        self._thread = threading.Thread(target=self._run, name="agentload-gpu", daemon=True)
        self._thread.start()

    def stop(self) -> GpuFigures:
        """End sampling; the point's figures."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        end = self._energy()
        if self._energy_start is not None and end is not None:
            energy, source = sum(b - a for a, b in zip(self._energy_start, end)) / 1000.0, "counter"
        else:
            energy, source = self._power_j, "power samples"
        util = sum(self._util) / len(self._util) if self._util else 0.0
        return GpuFigures(self._memory_max, util, energy, len(self._handles), source)

    def close(self) -> None:
        """Let NVML go (the sampler is not used after)."""
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            self._sample(time.monotonic() - last)
            last = time.monotonic()
            if self._stop.wait(INTERVAL_S):
                return

    def _sample(self, elapsed: float) -> None:
        nvml = self._nvml
        memory, utils, watts = 0.0, [], 0.0
        for handle in self._handles:
            memory += float(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            utils.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            try:
                watts += nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except nvml.NVMLError:
                pass
        self._memory_max = max(self._memory_max, memory)
        self._util.append(sum(utils) / len(utils))
        self._power_j += watts * elapsed

    def _energy(self) -> Optional[list[int]]:
        try:
            return [self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
        except self._nvml.NVMLError:
            return None


def open_sampler(mode: str) -> tuple[Optional[GpuSampler], Optional[str]]:
    """(a sampler, None) when NVML and a GPU are there and `mode` is not 'off'; else (None, why not)."""
    if mode == "off":
        return None, "GPU figures off (gpu: off)"
    try:
        import pynvml  # nvidia-ml-py, the `gpu` extra
    except ImportError:
        return None, "GPU figures absent: nvidia-ml-py is not installed (pip install 'agentload[gpu]')"
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as exc:
        return None, f"GPU figures absent: NVML: {exc}"
    if not handles:
        return None, "GPU figures absent: NVML sees no GPU"
    return GpuSampler(pynvml, handles), None
