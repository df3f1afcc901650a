"""Studies over fleets: fleet configs and their variants, a fleet study on the twin end to end (capacity
per replica count and policy, the sizing answer, $ per task for the fleet's GPUs, the router figures),
the sizing verdicts, and bad fleet configs named at their line and key.

The end-to-end study is built so that its answer is known: each replica is a twin of fixed step time
(25 ms a step, every other term zero) with four seats, and every task is one call of 4 output tokens,
so one replica completes at most 4 / (4 x 0.025 s) = 40 tasks a second; arrivals are evenly spaced and
round robin deals them evenly, so N replicas carry 40 N a second. A target of 100 tasks a second is then
beyond 2 replicas (80) and within 4 (160): the fewest replicas that carry it are 4."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main as cli_main
from simulator.errors import InputError
from simulator.study import schema
from simulator.study.configs import resolve
from simulator.study.model import CapacityResult, ConfigResult, FleetResult, Search
from simulator.study.sizing import carries, sizing

STEP_S = 0.025
SEATS = 4
OUTPUT_TOKENS = 4
PER_REPLICA = SEATS / (OUTPUT_TOKENS * STEP_S)  # 40 tasks/s

PROFILE = f"""\
name: fixed-step
scheduler: {{max_num_seqs: {SEATS}, max_num_batched_tokens: 8192, max_model_len: 4096}}
kv_cache: {{block_size: 16, num_blocks: 100000, enable_prefix_caching: true}}
step_time: {{fixed: {STEP_S}}}
"""

STUDY = f"""\
name: fleet-check
workload:
  synthetic: {{input_tokens: 16, output_tokens: {OUTPUT_TOKENS}, concurrency: 160, calls: 160}}
  stagger: 0.005
slo:
  task_s: {{p50: 0.2}}
configs:
  base:
    name: rr2
    fleet: {{replicas: 2, profile: fixed-step.yaml, router: {{policy: round_robin}}}}
  variants:
    - {{name: rr4, fleet: {{replicas: 4}}}}
    - {{name: lo2, fleet: {{router: {{policy: least_outstanding}}}}}}
capacity: {{low: 60, high: 120, precision: 0.1, repeats: 2, max_failed_share: 0, max_growth: 0.1}}
sizing: {{rate: 100, per: second}}
cost: {{gpu_hour: 2.0, gpus: 1}}
"""


def _study(tmp_path, text=STUDY):
    (tmp_path / "fixed-step.yaml").write_text(PROFILE)
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_a_variant_changes_the_base_fleet_key_by_key(tmp_path):
    text = STUDY.replace("    - {name: lo2, fleet: {router: {policy: least_outstanding}}}",
                         "    - name: ca4\n      fleet: {replicas: 4, router: {policy: cache_aware, cache_threshold: 0.5},"
                         " session: {sub_agents: own}}")
    text = text.replace("router: {policy: round_robin}}", "router: {policy: round_robin, balance_abs_threshold: 8}}")
    configs = {c.name: c for c in resolve(schema.load(_study(tmp_path, text)))}
    base, bigger, cache = configs["rr2"], configs["rr4"], configs["ca4"]
    assert (base.replicas, bigger.replicas, cache.replicas) == (2, 4, 4)
    assert bigger.fleet.router.policy == "round_robin" and bigger.fleet.router.balance_abs_threshold == 8
    # nested keys merge one by one: the base's other router settings stay, the variant's own come in
    assert cache.fleet.router.policy == "cache_aware" and cache.fleet.router.cache_threshold == 0.5
    assert cache.fleet.router.balance_abs_threshold == 8 and cache.fleet.session.sub_agents == "own"
    assert base.fleet.session.sub_agents == "parent"
    assert bigger.differs_by == "fleet.replicas=4"
    assert all(c.fleet.profile == str(tmp_path / "fixed-step.yaml") and not c.live for c in configs.values())


def test_a_fleet_variant_of_a_single_server_base_runs_the_base_server(tmp_path):
    text = STUDY.replace("    name: rr2\n    fleet: {replicas: 2, profile: fixed-step.yaml, router: {policy: round_robin}}",
                         "    name: one\n    profile: fixed-step.yaml\n    overlay: {scheduler: {max_num_seqs: 2}}")
    configs = {c.name: c for c in resolve(schema.load(_study(tmp_path, text)))}
    assert configs["one"].fleet is None and configs["one"].replicas == 1
    fleet = configs["rr4"]
    assert fleet.fleet.replicas == 4 and fleet.profile == str(tmp_path / "fixed-step.yaml")
    assert fleet.overlay == {"scheduler": {"max_num_seqs": 2}}


@pytest.mark.parametrize("old, new, where", [
    ("fleet: {replicas: 2,", "fleet: {replicas: 0,", "study.yaml:10: at configs.base.fleet.replicas: field 'replicas'"),
    ("{name: rr4, fleet: {replicas: 4}}", "{name: rr4, fleet: {replica: 4}}",
     "study.yaml:12: at configs.variants.0.fleet.replica: field 'replica': unknown key"),
    ("{name: lo2, fleet: {router: {policy: least_outstanding}}}", "{name: lo2, fleet: {router: {policy: least_outstandin}}}",
     "study.yaml:13: at configs.variants.1.fleet.router.policy: field 'policy': config lo2: the twin has no router "
     "policy 'least_outstandin' (did you mean least_outstanding?)"),
    ("{name: rr4, fleet: {replicas: 4}}", "{name: rr4, fleet: {replicas: 4, emulator: {}, router: {policy: prefix_score}}}",
     "study.yaml:12: at configs.variants.0.fleet.router.policy: field 'policy': config rr4: sglang-router has no "
     "router policy 'prefix_score'"),
    # valid alone, not over the base's two replicas: the merged fleet is checked and named at the variant
    ("{name: rr4, fleet: {replicas: 4}}", "{name: rr4, fleet: {disaggregation: {prefill: 1, decode: 2, "
     "kv_bytes_per_token: 1, link_gbps: 1}}}", "study.yaml:12: at configs.variants.0.fleet: field 'fleet': "
     "config rr4: fleet: `replicas` (2) is not the prefill and decode pools' sum"),
])
def test_a_bad_fleet_config_is_named_at_its_line_and_key(tmp_path, old, new, where):
    assert old in STUDY
    with pytest.raises(InputError) as err:
        resolve(schema.load(_study(tmp_path, STUDY.replace(old, new))))
    assert str(err.value).startswith(str(tmp_path / where)), str(err.value)


def _fleet_config(name: str, replicas: int, ci, *, router: str = "round_robin", status: str = "ok",
                  lows=(None,)) -> ConfigResult:
    rate = None if ci is None else (ci[0] + ci[1]) / 2
    cap = CapacityResult(rate_per_s=rate, ci_per_s=ci, status=status, estimates=0 if ci is None else 2,
                         repeats=[Search(low=low) for low in lows])
    return ConfigResult(name=name, capacity=cap, fleet=FleetResult(replicas=replicas, router=router, gpus=replicas))


def test_sizing_takes_the_fewest_replicas_whose_interval_clears_the_rate():
    configs = [_fleet_config("rr8", 8, (2.1, 2.5)), _fleet_config("rr4", 4, (1.05, 1.3)),
               _fleet_config("rr2", 2, (0.4, 0.6)), _fleet_config("rr3", 3, (0.9, 1.1))]
    spec = schema.SizingSpec(rate=60, per="minute")  # 1 task a second
    cost = schema.CostSpec(gpu_hour=3.0, gpus=1)
    answer = sizing(spec, configs, cost, 0.9)
    verdicts = {row.config: row.carries for row in answer.rows}
    assert verdicts == {"rr8": "yes", "rr4": "yes", "rr2": "no", "rr3": "unsure"}
    assert (answer.fewest, answer.replicas, answer.gpus) == ("rr4", 4, 4)
    assert answer.cost_per_task_at_rate == pytest.approx(3.0 * 4 / 3600)  # 4 GPUs for 3,600 tasks an hour
    assert answer.groups[0].configs == ["rr2", "rr3", "rr4", "rr8"] and answer.groups[0].fewest == "rr4"
    # asked for more than any carries: no answer, and the reason says what the largest reached
    more = sizing(schema.SizingSpec(rate=3, per="second"), configs, cost, 0.9)
    assert more.fewest is None and "no fleet config carries 3.00 tasks/s" in more.answer and "rr8" in more.answer


def test_sizing_needs_an_interval_or_a_bound():
    one_repeat = CapacityResult(rate_per_s=5.0, ci_per_s=None, status="ok", estimates=1)
    assert carries(one_repeat, 1.0)[0] == "unknown"
    above = CapacityResult(status="above_range", at_least_per_s=4.0, repeats=[Search(low=3.0), Search(low=4.0)])
    assert carries(above, 2.9)[0] == "yes" and carries(above, 3.5)[0] == "unknown"
    below = CapacityResult(status="below_range", at_most_per_s=0.5)
    assert carries(below, 1.0)[0] == "no"


def test_a_fleet_study_on_the_twin(tmp_path):
    path = _study(tmp_path)
    out = tmp_path / "out"
    assert cli_main(["study", str(path), "-o", str(out)]) == 0
    study = json.loads((out / "study.json").read_text())
    configs = {c["name"]: c for c in study["configs"]}
    for name, c in configs.items():
        cap = c["capacity"]
        print(f"{name}: capacity {cap['rate_per_s']:.1f}/s CI {cap['ci_per_s']}, fleet {c['fleet']}")
    # each replica count's capacity: 40 tasks/s a replica under round robin
    for name, replicas in (("rr2", 2), ("rr4", 4)):
        cap = configs[name]["capacity"]
        assert cap["ci_per_s"] is not None
        assert abs(cap["rate_per_s"] - replicas * PER_REPLICA) <= 0.1 * replicas * PER_REPLICA
    assert configs["lo2"]["capacity"]["rate_per_s"] is not None
    # the sizing answer: 2 replicas do not carry 100 tasks/s, 4 do
    sizing_part = study["sizing"]
    assert {r["config"]: r["carries"] for r in sizing_part["rows"]}["rr2"] == "no"
    assert (sizing_part["fewest"], sizing_part["replicas"]) == ("rr4", 4)
    # $ per task pays for every replica's GPU: gpu_hour x replicas / tasks per hour at the capacity
    for name, replicas in (("rr2", 2), ("rr4", 4)):
        c = configs[name]
        assert c["fleet"]["gpus"] == replicas
        assert c["cost"]["self_hosted_per_task"] == pytest.approx(2.0 * replicas / (c["capacity"]["rate_per_s"] * 3600))
        assert c["fleet"]["per_gpu_per_min"] == pytest.approx(c["capacity"]["rate_per_s"] * 60 / replicas)
    assert sizing_part["cost_per_task_at_rate"] == pytest.approx(2.0 * 4 / (100 * 3600))
    # the router's figures from the points' summaries, overall and per task class
    for c in configs.values():
        fleet = c["fleet"]
        assert fleet["points"] > 0 and fleet["imbalance"] >= 1.0
        (only,) = fleet["by_class"].values()
        assert only["tasks"] > 0 and only["task_p95_s"] > 0
    assert configs["rr4"]["fleet"]["imbalance"] == pytest.approx(1.0, abs=0.05)  # round robin deals evenly
    # the terminal table and the report show the same cells
    assert cli_main(["report", str(out), "--html", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "Routers: cache hits against balance" in page and "Fleets: size, capacity per GPU and cost" in page
