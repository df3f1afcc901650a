"""The twin calibrated on the base config's server, as `agentload calibrate` does it
(`simulator.calibration.pipeline`), kept in the study folder (calibration/profile.yaml and report.txt) so
that a restarted study does not measure it again."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..calibration.pipeline import calibrate as run_calibration
from ..calibration.pipeline import on_server
from ..calibration.report import profile_text
from ..calibration.sweep import design_sweep
from ..errors import InputError
from ..live.client import Target
from ..redact import mask_url
from ..sim.profile import ServerProfile, load_profile

PROFILE_FILE = "profile.yaml"


def saved(folder: Path) -> Optional[ServerProfile]:
    """The profile a previous run of the study calibrated (None when there is none)."""
    path = folder / PROFILE_FILE
    return load_profile(str(path)) if path.is_file() else None


def calibrate(target: Target, base: ServerProfile, folder: Path, *, repeat: int,
              max_prompt: Optional[int] = None) -> ServerProfile:
    """Measure the sweep on `target`, fit `base`'s coefficients, save and return the calibrated profile."""
    points = design_sweep(base, max_prompt=max_prompt)
    if not points:
        raise InputError("the calibration sweep is empty with this max prompt", path="twin.calibrate_max_prompt")
    calibration = run_calibration(base, points, on_server(target, base, repeat=repeat),
                                  server=mask_url(target.base_url))  # points no round measured left out
    trend = calibration.measured.trend
    drift = "" if trend is None else f", rounds' trend {trend:+.1%}"
    profile = calibration.profile.model_copy(update={
        "name": f"{base.name}-study-calibrated", "calibrated": True,
        "source": f"agentload study: calibrated on {mask_url(target.base_url)} (median of {repeat} repeats{drift})"})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.txt").write_text(calibration.report_text() + "\n" + calibration.measured.rounds_text() + "\n")
    rms = calibration.result.rms_relative_error
    comment = f"fitted by agentload study (rms relative error {rms:.2%})"
    (folder / PROFILE_FILE).write_text(profile_text(profile, [comment]))
    return profile
