"""How far a profile's predictions can be trusted: its calibration error, and what it leans on that no
measurement of the server backs.

`agentload simulate` puts this in the summary (the ``simulation`` section) and prints it; a study ranking
configs on the twin should read it before believing a small difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .profile import STEP_SETTINGS, ServerProfile

DRIFT_WARNING = 0.03
"""A trend of a live calibration sweep's rounds' times larger than this (either way) is reported as the
server's drift (`CalibrationRecord.drift`): each point's median then mixes speeds."""

SPEC_TERMS = frozenset({"per_spec_token", "per_draft_pass"})
"""Step-time terms that act only with speculative decoding."""


@dataclass(frozen=True)
class Uncertainty:
    """A profile's calibration error and its unmeasured parts."""

    calibrated: bool
    rms_error: Optional[float]
    """The calibration fit's rms relative error (None: no calibration, or none recorded)."""
    worst_error: Optional[float]
    points: int
    drift: Optional[float]
    """The calibration sweep's rounds' trend (CalibrationRecord.drift; None: not measured)."""
    uncalibrated: tuple[str, ...]
    """What the predictions lean on without a measurement behind it (profile fields, with why)."""

    def statement(self) -> str:
        """One line for a console or a report."""
        if self.calibrated and self.rms_error is not None:
            text = (f"calibrated: step times fit the sweep within {self.rms_error:.1%} rms "
                    f"({self.points} points, worst {self.worst_error or 0:.1%})")
            if self.drift is not None:
                text += (f", the server's speed drifted {self.drift:+.1%} over it (past {DRIFT_WARNING:.0%}: the "
                         "fit mixes speeds)" if abs(self.drift) > DRIFT_WARNING
                         else f", the server steady over it ({self.drift:+.1%})")
        elif self.calibrated:
            text = "calibrated, fit error not recorded"
        else:
            text = "uncalibrated: no step-time coefficient was fitted to measurements of this server"
        if self.uncalibrated:
            text += "; not measured: " + ", ".join(self.uncalibrated)
        return text


def uncertainty(profile: ServerProfile) -> Uncertainty:
    """What is known about `profile`'s accuracy."""
    record = profile.calibration if profile.calibrated else None
    fitted = set(record.terms) if record is not None else set()
    unmeasured = []
    spec = profile.spec_decode.num_tokens
    terms = [name for name, value in profile.step_time.model_dump().items()
             if value and name not in STEP_SETTINGS and (spec or name not in SPEC_TERMS)
             and (not profile.calibrated or (record is not None and name not in fitted))]
    if terms:
        unmeasured.append("step_time (" + ", ".join(terms) + ")")
    if spec:
        unmeasured.append("spec_decode.acceptance (assumed; calibration runs without speculative decoding)")
    kv = profile.kv_cache
    if kv.num_blocks is None:
        unmeasured.append("kv_cache capacity (from memory_bytes, an estimate; vLLM reports num_gpu_blocks)")
    if kv.hybrid is not None and not profile.calibrated:
        unmeasured.append("kv_cache.hybrid (the model's layer shapes; the layout follows vLLM's code)")
    return Uncertainty(
        calibrated=profile.calibrated,
        rms_error=None if record is None else record.rms_relative_error,
        worst_error=None if record is None else record.worst_relative_error,
        points=0 if record is None else record.points,
        drift=None if record is None else record.drift,
        uncalibrated=tuple(unmeasured),
    )
