"""The live fleet executor: replicas brought up behind sglang-router (`simulator.fleet.launch`), the plan
replayed through the router exactly as `LiveExecutor` replays it against one server, each replica's
/metrics scraped meanwhile (`simulator.fleet.scrape`), and the summary's ``fleet`` section built from
them and the call records.

Calls go through the router as chat completions by default: sglang-router refuses the token-id prompts
of ``/v1/completions``. Each call carries its session's key (the fleet's `session` settings), and each
record the replica that answered (`simulator.scenario.fleet.REPLICA_HEADER`). The model list and the
text calibration's ``/tokenize`` are asked of the first replica: the router lists no model by its
name and has no /tokenize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..fleet.launch import Fleet, FleetError, open_fleet
from ..fleet.scrape import fleet_section, open_replica_probes, scraping_replicas
from ..scenario.fleet import REPLICA_HEADER, FleetSpec
from ..live.driver import Driver
from ..live.scrape import server_summary
from ..live.target import make_client, open_target
from ..redact import Redactor, url_secrets
from ..scenario import Scenario, TargetSpec
from .live import LiveExecutor, describe_live, replay_workload
from .plan import RunPlan
from .record import Outcome, Recorder

SERVER_NOTE = "a fleet: each replica's /metrics are in the `fleet` section (fleet/<replica>_metrics.jsonl)"
"""The ``server`` section's note on a fleet run (its per-task loads need one server's timeline)."""


def fleet_api(scenario: Scenario) -> str:
    """The API a fleet's calls use: the target's when given, else chat. InputError for token-id
    completions behind a launched sglang-router, which refuses them."""
    spec = scenario.fleet
    assert spec is not None
    if spec.disaggregation is not None:
        raise FleetError("prefill/decode disaggregation is modelled on the twin only (agentload simulate): "
                         "remove fleet.disaggregation for a live run", file=scenario.source,
                         path="fleet.disaggregation", field="disaggregation")
    target = scenario.target
    if target is None or "api" not in target.model_fields_set:
        return "chat"
    if target.api == "completions" and spec.router.url is None:
        raise FleetError("sglang-router refuses token-id prompts on /v1/completions (HTTP 422): set target.api: chat "
                         "(calibrated text prompts), or leave it out for a fleet", file=scenario.source,
                         path="target.api", field="api")
    return target.api


def aimed_at(scenario: Scenario, fleet: Fleet, api: str) -> Scenario:
    """`scenario` with its target the fleet's router, its calls in `api`."""
    target = scenario.target if scenario.target is not None else TargetSpec()
    return scenario.model_copy(update={"target": target.model_copy(update={"base_url": fleet.router_url, "api": api})})


def client_settings(spec: FleetSpec, fleet: Fleet) -> dict[str, Any]:
    """The client's fleet settings: session key header and ``user`` field, the replica header read from
    responses, the first replica asked for the model list and /tokenize."""
    return {"session_header": spec.session.header, "session_user": spec.session.user_field,
            "session_sub_agents": spec.session.sub_agents, "replica_header": REPLICA_HEADER,
            "setup_url": fleet.replicas[0].url}


@dataclass
class FleetLiveExecutor(LiveExecutor):
    """Replays a plan live through a fleet: its replicas and router brought up (logs in the result
    folder's ``fleet/``), checked, run.json written with the fleet described, the workload driven as
    `LiveExecutor` drives it while every replica's /metrics are scraped, the fleet stopped. A replica
    that exits meanwhile is noted in the summary (its calls fail or go elsewhere; the run goes on); a
    router that exits stops the run. `on_fleet` gets the fleet once it is up."""

    on_fleet: Optional[Callable[[Fleet], None]] = None

    async def replay(self, plan: RunPlan, recorder: Recorder) -> Outcome:
        scenario = plan.scenario
        assert scenario is not None and scenario.fleet is not None, "a fleet run replays a scenario with a fleet"
        spec = scenario.fleet
        api = fleet_api(scenario)
        with self.stopping() as stopper:
            async with open_fleet(spec, plan.folder, scenario.resolve, source=scenario.source) as fleet:
                if self.on_fleet is not None:
                    self.on_fleet(fleet)
                aimed = aimed_at(scenario, fleet, api)
                async with open_target(aimed, **client_settings(spec, fleet)) as target:
                    async with make_client(target, scenario.run) as client:
                        checked = await self.check(client)
                        redact = Redactor([*target.secrets(), *(s for r in fleet.replicas for s in url_secrets(r.url))])
                        metrics = aimed.target is None or aimed.target.metrics
                        probes = await open_replica_probes(fleet, scenario.run.scrape_interval, redact) if metrics else {}
                        describe_live(recorder, aimed, target, checked, fleet=fleet.describe())
                        stopper.folder_made = True

                        def on_driver(driver: Driver) -> None:
                            fleet.on_router_exit = lambda code: driver.stop("router_exited")
                            if self.on_driver is not None:
                                self.on_driver(driver)

                        with recorder.writer() as writer:
                            result = await replay_workload(
                                plan.workload, client, writer, None, stopper, plan.driver,
                                on_progress=self.on_progress, on_driver=on_driver,
                                scrape=lambda t0: scraping_replicas(probes, t0, plan.folder))
                            writer.close()
                            itl = writer.itl
        server = server_summary(plan.folder, None, SERVER_NOTE, recorder.server, scenario.run.scrape_interval, redact)
        return Outcome(result, itl, server, fleet=fleet_section(plan.folder, fleet, probes, redact))
