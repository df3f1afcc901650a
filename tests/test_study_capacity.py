"""The capacity search against a server whose capacity is known: the built-in emulator, launched by the
study as a server, timing its tokens with a twin profile of fixed step time (25 ms a step, every
term but `fixed` zero) and four seats (max_num_seqs 4). A call of 4 output tokens holds a seat for
4 steps (its prefill step gives the first token), so the server completes at most 4 / (4 x 0.025 s)
= 40 calls a second. Tasks of one call arrive evenly spaced (a deterministic stream), so below 40 a
second no call waits for a seat and above it the queue grows for the whole run: the capacity within
the task SLO is 40 tasks a second. The search must find it within 5%, with its CI covering it.

The bracket and the run's length are chosen so that every rate the search probes is clear of the
capacity by at least as much as a run can tell (2% below it, or enough above it that the queue grows by
more than twice the bound `max_growth` sets): each probe's verdict is then certain, not a coin toss on a
busy machine, and the search takes four probes a repeat instead of seven."""

from __future__ import annotations

import json
import sys
import textwrap

from simulator.cli import main as cli_main

STEP_S = 0.025
OUTPUT_TOKENS = 4
SEATS = 4
ANALYTICAL = SEATS / (OUTPUT_TOKENS * STEP_S)  # 40 tasks/s

PROFILE = f"""\
name: fixed-step
scheduler: {{max_num_seqs: {SEATS}, max_num_batched_tokens: 8192, max_model_len: 4096}}
kv_cache: {{block_size: 16, num_blocks: 100000, enable_prefix_caching: false}}
step_time: {{fixed: {STEP_S}}}
"""

# 120 tasks: 3 s at the capacity. The task SLO's median bound sits 50 ms (two steps) above the
# unloaded task time (4 steps plus at most one step waiting for the next step to start, plus HTTP).
# A finite run holds that bound up to about the margin over half the run above the capacity (~2%: the
# queue has not grown enough by the end); `max_growth` asks for a steady queue as well: the tasks' extra
# time over the same tasks at the first rate probed must not grow over the run by more than 15 ms
# (10% of the bound), which a rate 0.5% over the capacity already makes it do.
#
# The search: 36.5 holds, 42 misses (the bracket), then 39.15 holds (2.1% below the capacity) and
# 40.55 misses (1.4% above: its queue grows by ~40 ms over the run); [39.15, 40.55] is within 4%.
STUDY = f"""\
name: capacity-check
workload:
  synthetic: {{input_tokens: 16, output_tokens: {OUTPUT_TOKENS}, concurrency: 120, calls: 120}}
  stagger: 0.025
slo:
  task_s: {{p50: 0.15}}
configs:
  base:
    name: fixed
    server:
      argv: [{sys.executable}, -m, simulator, serve-emulator, --port, "{{port}}", --profile, PROFILE]
      startup_timeout: 60
capacity: {{low: 36.5, high: 42, precision: 0.04, repeats: 2, max_failed_share: 0, max_growth: 0.1}}
"""


def test_capacity_of_a_server_with_known_capacity(tmp_path):
    profile = tmp_path / "fixed-step.yaml"
    profile.write_text(PROFILE)
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.replace("PROFILE", str(profile)))
    assert cli_main(["study", str(study), "-o", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "study.json").read_text())
    capacity = result["configs"][0]["capacity"]
    assert capacity["status"] == "ok"
    found = capacity["rate_per_s"]
    low, high = capacity["ci_per_s"]
    for p in result["configs"][0]["points"]:
        growth = "-" if p["growth_over_run_s"] is None else f"{p['growth_over_run_s'] * 1e3:.1f} ms"
        print(f"  r{p['repeat']} rate {p['load']:.2f}: held {p['slo_met']}, task p50 {p['task_p50_s']:.3f} s, "
              f"extra time's growth over the run {growth}")
    print(f"capacity {found:.2f}/s, CI [{low:.2f}, {high:.2f}], analytical {ANALYTICAL:.2f}; brackets "
          + ", ".join(f"[{r['low']:.2f}, {r['high']:.2f}]" for r in capacity["repeats"]))
    assert abs(found - ANALYTICAL) <= 0.05 * ANALYTICAL
    assert low <= ANALYTICAL <= high
    # each repeat's search bracketed (36.5 held, 42 failed) and then bisected to 4%
    for search in capacity["repeats"]:
        assert search["probes"][0] == {"rate": 36.5, "verdict": "held"}
        assert search["probes"][1] == {"rate": 42.0, "verdict": "missed"}
        assert len(search["probes"]) > 2 and search["high"] <= search["low"] * 1.04
