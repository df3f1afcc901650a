"""The recorder end to end: `agentload run` replays a generated agent workload with sub-agents through
`agentload record` to the built-in emulator; the recording groups the calls into the replayed tasks (by
the session header, and without it: inferred), keeps their gaps and token counts, and replayed in turn
gives the same prefix-cache hit share."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from recorder_runs import agent_workload, emulator, matched_owners, recorder, share_right, write_native
from simulator.cli import main
from simulator.model.fidelity import compare_workloads
from simulator.traces import load



def _run(tmp: Path, name: str, trace: Path, url: str, session: bool = False, time_scale: float = 1.0) -> Path:
    scenario = {
        "name": name,
        "workload": {"trace": str(trace), "transforms": {"time_scale": time_scale, "gap_scale": time_scale}},
        "target": {"base_url": url, "metrics": False,
                   **({"session": {"header": "x-agentload-session"}} if session else {})},
        "run": {"seed": 3, "output": str(tmp / "results")},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(scenario))
    out = tmp / "results" / name
    assert main(["run", str(path), "-o", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One workload replayed by `agentload run`, sending the session header, through two recorders in a
    row to the emulator: the first is told to read another header, so it records the calls without one
    (and, next to the client, sees their gaps as a lone recorder would); the second groups by the header."""
    tmp = tmp_path_factory.mktemp("rec")
    workload = agent_workload(tasks=16, rate=3.0, seed=47)
    trace = write_native(workload, tmp / "sent.jsonl")
    with emulator() as (emu, _), \
            recorder(emu, tmp / "rec-True.jsonl") as (keyed, p2), \
            recorder(keyed, tmp / "rec-False.jsonl", "--session-header", "x-not-sent", "--no-traceparent") as (blind, p1):
        result = _run(tmp, "through", trace, blind, session=True)
        for proc in (p1, p2):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
    return {"workload": workload, "trace": trace, "tmp": tmp,
            **{session: (result, load([tmp / f"rec-{session}.jsonl"])) for session in (False, True)}}


def test_without_a_header_calls_are_grouped_into_their_tasks(recorded):
    result, recording = recorded[False]
    owners = matched_owners(result / "calls.jsonl", recording)
    sent_calls = recorded["workload"].counts()[1]
    assert len(owners["true_top"]) == sent_calls  # every call recorded and matched
    right, own = share_right(owners["true_top"], owners["found_top"]), share_right(owners["true_own"], owners["found_own"])
    found_subs = recording.counts()[2]
    print(f"no header: {right:.1%} of {len(owners['true_top'])} calls in the right task, {own:.1%} in the right "
          f"(sub-)task; {found_subs} sub-agents found of {recorded['workload'].counts()[2]}")
    assert right >= 0.95
    # sub-agents found: most of the sent ones, each a (sub-)task of its own
    assert own >= 0.9
    assert 0.8 * recorded["workload"].counts()[2] <= found_subs <= 1.2 * recorded["workload"].counts()[2]


def test_with_the_session_header_every_call_is_in_its_task(recorded):
    result, recording = recorded[True]
    owners = matched_owners(result / "calls.jsonl", recording)
    assert len(owners["true_top"]) == recorded["workload"].counts()[1]
    assert share_right(owners["true_top"], owners["found_top"]) == 1.0


def test_the_recording_keeps_gaps_and_token_counts(recorded):
    _, recording = recorded[False]
    comparison = {m.name: m for m in compare_workloads(recorded["workload"], recording).marginals}
    print("KS, recording vs sent: " + ", ".join(f"{n} {comparison[n].ks:.3f}" for n in ("input_tokens", "output_tokens", "gaps_s")))
    for name in ("input_tokens", "output_tokens", "gaps_s"):
        assert comparison[name].ks <= 0.05, (name, comparison[name])


def test_the_recording_replays_with_the_recorded_hit_share(recorded):
    result, _ = recorded[False]
    hit = json.loads((result / "summary.json").read_text())["server"]["usage_cached_tokens"]["hit_share"]
    # replayed four times as fast: the emulator's cache never evicts, so what the share depends on is the
    # prefixes the recording's block ids share, not the time between calls
    with emulator() as (emu, _):
        replay = _run(recorded["tmp"], "replay", recorded["tmp"] / "rec-False.jsonl", emu, time_scale=0.25)
    again = json.loads((replay / "summary.json").read_text())["server"]["usage_cached_tokens"]["hit_share"]
    print(f"prefix-cache hit share: recorded run {hit:.3f}, the recording replayed {again:.3f}")
    assert hit > 0.5 and abs(again - hit) <= 0.03, (hit, again)
