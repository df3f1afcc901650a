"""The twin calibrated on the base config's server, as `agentload calibrate` does it (the sweep of
`simulator.sim.calibrate`, measured by `simulator.live.calibration`), kept in the study folder
(calibration/profile.yaml and report.txt) so that a restarted study does not measure it again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Optional

import yaml

from ..errors import InputError
from ..live.calibration import measure_sweep, round_speeds, rounds_text, speed_trend, usable_sweep
from ..live.client import Target
from ..redact import mask_url
from ..sim.calibrate import design_sweep, fit, fit_report
from ..sim.profile import ServerProfile, load_profile

PROFILE_FILE = "profile.yaml"


def saved(folder: Path) -> Optional[ServerProfile]:
    """The profile a previous run of the study calibrated (None when there is none)."""
    path = folder / PROFILE_FILE
    return load_profile(str(path)) if path.is_file() else None


def calibrate(target: Target, base: ServerProfile, folder: Path, *, repeat: int,
              max_prompt: Optional[int] = None) -> ServerProfile:
    """Measure the sweep on `target`, fit `base`'s coefficients, save and return the calibrated profile."""
    points = design_sweep(base)
    if max_prompt:
        points = [p for p in points if p.input_tokens <= max_prompt]
    if not points:
        raise InputError("the calibration sweep is empty with this max prompt", path="twin.calibrate_max_prompt")
    missed: dict[int, list[str]] = {}
    samples = asyncio.run(measure_sweep(target, points, block_size=base.kv_cache.block_size,
                                        scheduler=base.scheduler, repeat=repeat,
                                        on_missed=lambda index, _, why: missed.setdefault(index, []).append(why)))
    usable = usable_sweep(points, samples, missed, server=mask_url(target.base_url))  # points no round measured left out
    result = fit(usable.points, usable.values, base)
    speeds = round_speeds(samples)
    trend = speed_trend(speeds)
    drift = "" if trend is None else f", rounds' trend {trend:+.1%}"
    profile = result.profile.model_copy(update={
        "name": f"{base.name}-study-calibrated", "calibrated": True,
        "calibration": result.profile.calibration.model_copy(update={"drift": trend}),
        "source": f"agentload study: calibrated on {target.base_url} (median of {repeat} repeats{drift})"})
    folder.mkdir(parents=True, exist_ok=True)
    skipped = usable.skipped_text()
    (folder / "report.txt").write_text(fit_report(result) + "\n" + (skipped + "\n" if skipped else "")
                                       + rounds_text(speeds, trend) + "\n")
    text = yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False)
    (folder / PROFILE_FILE).write_text(f"# fitted by agentload study (rms relative error {result.rms_relative_error:.2%})\n"
                                       + text)
    return profile
