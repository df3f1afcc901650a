"""A live fleet config as something that runs points: each point replayed through the fleet's router by
the live fleet executor (`simulator.pipeline.fleet_live`), which brings the replicas and the router up
for the point (their logs in the point's folder, ``fleet/``) and stops them after it, so that every
point starts from empty caches as a simulated one does. A fleet that cannot come up (a replica never
healthy, sglang-router missing) fails the point with the reason; a replica that dies during it is noted
in the point's summary (``fleet.died``) and the others go on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Optional

from ..live.stopper import RunAborted
from ..metrics.summary import Summary
from ..pipeline.execute import execute_async
from ..pipeline.plan import plan_run
from ..scenario import Scenario, TargetSpec
from ..workload import Workload
from .backends import PointError
from .configs import Config


class FleetLiveBackend:
    """A config whose points go to a fleet of live replicas behind a router. `target_defaults`: the
    study's `target` settings (model, api, timeouts), over the scenario's that it set."""

    live = True

    def __init__(self, config: Config, target_defaults: Optional[dict[str, Any]], study_dir: Path) -> None:
        assert config.fleet is not None
        self.config = config
        self.target_defaults = dict(target_defaults or {})
        self.study_dir = study_dir

    def ensure(self) -> float:
        """Nothing to start before a point (the point brings its fleet up); 0 seconds."""
        return 0.0

    def scenario_for(self, scenario: Scenario) -> Scenario:
        """`scenario` with this config's fleet: its target only the call settings the scenario and the
        study gave (the router is the target's URL; an API left unsaid is the fleet's default, chat)."""
        fields = scenario.target.model_dump(exclude_unset=True, exclude={"base_url"}) if scenario.target else {}
        fields.update(self.target_defaults)
        if self.config.model:
            fields["model"] = self.config.model
        target = TargetSpec.model_validate(fields) if fields else None
        return scenario.model_copy(update={"fleet": self.config.fleet, "target": target})

    def run_point(self, scenario: Scenario, workload: Workload, folder: Path) -> Summary:
        """Run the point live into `folder` through the fleet; PointError when the fleet cannot come up
        (or the router exits), KeyboardInterrupt after a Ctrl-C (the point's records kept)."""
        from ..fleet.launch import FleetError  # noqa: PLC0415 - the live fleet's machinery, only when used
        from ..pipeline.fleet_live import FleetLiveExecutor  # noqa: PLC0415

        signals: list[int] = []
        plan = plan_run(self.scenario_for(scenario), workload, folder)
        try:
            with asyncio.Runner() as runner:
                summary, result = runner.run(execute_async(plan, FleetLiveExecutor(on_signal=signals.append)))
        except RunAborted:
            raise KeyboardInterrupt from None
        except FleetError as exc:
            raise PointError(f"the fleet did not come up: {exc}") from None
        if signals:
            raise KeyboardInterrupt
        if result.stop_reason == "router_exited":
            raise PointError("the router exited during the point")
        return summary

    def server_info(self) -> Optional[dict[str, Any]]:
        """Nothing kept across points (each point's fleet logs are in its folder): None."""
        return None

    def close(self) -> None:
        """Nothing to stop (each point stops its fleet)."""
