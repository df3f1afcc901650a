"""The texts of a calibration: the fit's report (each term with its standard error, each point's measured
and predicted value) and the calibrated profile's YAML with the comments above it."""

from __future__ import annotations

from typing import Sequence

import yaml

from ..sim.profile import ServerProfile
from .fit import FitResult


def fit_report(result: FitResult) -> str:
    """The fitted terms with their standard errors, then each point's measured and predicted value."""
    lines = ["term                 coefficient      std error   (relative)"]
    for term, value in result.coefficients.items():
        err = result.stderr[term]
        rel = f"{err / value:9.1%}" if value > 0 else "      n/a"
        lines.append(f"{term:18s} {value:13.4e}  {err:13.4e}   {rel}")
    lines.append(f"rms relative error over {len(result.points)} points: {result.rms_relative_error:.2%}")
    for point, m, p in zip(result.points, result.measured, result.predicted):
        lines.append(f"  {point.label():34s} measured {m * 1e3:10.3f} ms  predicted {p * 1e3:10.3f} ms  "
                     f"{p / m - 1:+7.2%}")
    return "\n".join(lines)


def calibrate_comments(rms: float, skipped: str = "") -> list[str]:
    """The comments `agentload calibrate` writes above the profile: the fit's error, what the fitted
    terms hold, and the points the sweep skipped (`UsableSweep.skipped_text`), if any."""
    return [f"Calibrated by `agentload calibrate` (rms relative error of the fit {rms:.2%}).",
            "Scheduling overhead is folded into the fixed and per-sequence terms; the API server's",
            "one-at-a-time work per request is frontend_per_request (+ frontend_per_prompt_token per",
            "prompt token), per streamed token frontend_per_output_token; other time outside the engine",
            "request_overhead.", *skipped.splitlines()]


def profile_text(profile: ServerProfile, comments: Sequence[str] = ()) -> str:
    """`profile` as a YAML file (what `load_profile` reads back), under `comments`, one line each."""
    data = profile.model_dump(mode="json", exclude_none=True)
    return "".join(f"# {line}\n" for line in comments) + yaml.safe_dump(data, sort_keys=False)
