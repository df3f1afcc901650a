"""Hash ids derived where a trace has none: from message content (`simulator.traces.content`, used by the
OTel and native importers) and from the conversation's structure (`simulator.traces.structure`, the
`--assume-append-only` option and the scenario's `workload.assume_append_only`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import scenario as sc
from simulator.model.schema import load_model
from simulator.model.stats import workload_stats
from simulator.traces import load, native
from simulator.traces.content import ContentHasher, Estimate
from simulator.traces.structure import assume_append_only
from simulator.workload import Call, Provenance, SubTask, Task, Workload

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SYSTEM = {"role": "system", "content": "You are a helpful agent. " * 20}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- from content --------------------------------------------------------------------------------------


def test_a_growing_conversation_shares_every_full_block_of_the_previous_prompt():
    hasher = ContentHasher(16)
    one = [SYSTEM, user("list the files " * 5)]
    two = one + [assistant("I will run ls. " * 4), user("tool: a.py b.py c.py " * 4)]
    ids1 = hasher.hash_ids(one, 170)
    ids2 = hasher.hash_ids(two, 240)
    assert len(ids1) == 170 // 16 and len(ids2) == 240 // 16  # the partial last block gets no id
    assert ids2[: len(ids1)] == ids1
    assert len(set(ids2[len(ids1):])) == len(ids2) - len(ids1)
    assert all(0 <= i < 1 << 63 for i in ids1 + ids2)
    assert hasher.hash_ids([], 100) == () and hasher.hash_ids(one, 0) == ()


def test_ids_are_chained_a_different_earlier_message_changes_every_later_block():
    hasher = ContentHasher(16)
    tail = [user("same question " * 10)]
    a = hasher.hash_ids([SYSTEM] + tail, 200)
    b = hasher.hash_ids([{"role": "system", "content": "Another prompt. " * 30}] + tail, 200)
    assert not set(a) & set(b)  # equal later content after a different prefix is not the same block


def test_a_shared_system_prompt_is_shared_across_conversations_and_the_role_header_with_it():
    hasher = ContentHasher(16)
    a = hasher.hash_ids([SYSTEM, user("first task " * 8)], 160)
    b = hasher.hash_ids([SYSTEM, user("second task, longer " * 8)], 180)
    c = hasher.hash_ids([SYSTEM, assistant("a reply first " * 8)], 170)
    ab, ac = shared_blocks(a, b), shared_blocks(a, c)
    assert 5 <= ac <= ab < len(a)  # the system prompt's blocks; a user header after it may add one more
    assert not set(a[ab:]) & set(b[ab:])


def test_keys_in_another_order_are_the_same_message():
    hasher = ContentHasher(16)
    a = hasher.hash_ids([{"role": "user", "content": "hi " * 40}], 64)
    b = hasher.hash_ids([{"content": "hi " * 40, "role": "user"}], 64)
    assert a == b and len(a) == 4


def test_a_known_prefix_longer_than_a_later_prompt_is_laid_out_afresh():
    hasher = ContentHasher(16)
    first = hasher.hash_ids([SYSTEM, user("question " * 30)], 400)
    shorter = hasher.hash_ids([SYSTEM, user("question " * 30), user("more")], 120)  # counts disagree
    assert hasher.relaid == 1 and len(shorter) == 7
    assert shared_blocks(first, shorter) < 7
    assert "laid out afresh" in hasher.notes()[0]


def test_calibration_fits_tokens_per_byte_to_the_source():
    rows = [(2, 800, 8 + 200), (4, 1200, 16 + 300), (6, 2000, 24 + 500)]
    est = Estimate.fit(rows)
    assert est.per_byte == pytest.approx(0.25) and est.fitted_on == 3
    assert Estimate.fit(rows[:2]).fitted_on == 0  # too few calls: the defaults
    assert Estimate.fit([(1, 10, 500)] * 3).fitted_on == 0  # 50 tokens a byte: implausible
    hasher = ContentHasher()
    hasher.calibrate([([SYSTEM, user("x " * 50)], 300)] * 3)
    assert hasher.estimate.fitted_on == 3 and "fitted to 3 calls" in hasher.estimate.describe()


def test_native_calls_with_messages_get_ids_and_keep_them_through_a_round_trip(tmp_path):
    turn1 = (SYSTEM, user("fix the bug " * 10))
    turn2 = turn1 + (assistant("looking " * 10), user("tool: done " * 10))
    task = Task("t", (Call(170, 12, messages=turn1), Call(230, 8, gap=1.0, messages=turn2)))
    other = Task("u", (Call(180, 5, messages=(SYSTEM, user("another task " * 10))),), arrival=5.0)
    recorded = Task("v", (Call(64, 4, hash_ids=(1, 2, 3, 4), block_size=16, messages=(user("x"),)),), arrival=9.0)
    path = tmp_path / "content.jsonl"
    native.write(Workload((task, other, recorded), (Provenance("hand-made", "native"),)), path)
    wl = load([path])
    t, u, v = wl.tasks
    assert [len(c.hash_ids) for c in t.calls] == [10, 14] and t.calls[0].block_size == 16
    assert t.calls[1].hash_ids[:10] == t.calls[0].hash_ids
    assert shared_blocks(t.calls[0].hash_ids, u.calls[0].hash_ids) >= 4  # the system prompt
    assert v.calls[0].hash_ids == (1, 2, 3, 4)  # recorded ids are kept
    assert t.calls[0].messages == turn1  # the native schema keeps content
    assert "hash ids from message content for 3 calls" in " ".join(wl.provenance[0].notes)
    native.write(wl, tmp_path / "again.jsonl")
    again = load([tmp_path / "again.jsonl"])
    assert again.tasks == wl.tasks and again.provenance == wl.provenance


# -- from structure ------------------------------------------------------------------------------------


def _lengths_only() -> Workload:
    sub = Task("a/sub", (Call(300, 20), Call(350, 10)))
    a = Task("a", (Call(1000, 100), Call(1200, 50), Call(1220, 30), Call(400, 20), Call(500, 10)),
             subtasks=(SubTask(0, sub),))
    b = Task("b", (Call(1000, 100),), arrival=1.0)
    c = Task("c", (Call(64, 1, hash_ids=(7, 8, 9, 10), block_size=16), Call(80, 1, hash_ids=(7, 8, 9, 10, 11), block_size=16)),
             arrival=2.0)
    return Workload((a, b, c), (Provenance("x.csv", "burstgpt"),))


def test_append_only_keeps_the_previous_prompt_and_counts_how_calls_fit():
    wl, counts = assume_append_only(_lengths_only())
    a, b, c = wl.tasks
    ids = [call.hash_ids for call in a.calls]
    assert [len(i) for i in ids] == [62, 75, 76, 25, 31]
    assert ids[1][:62] == ids[0] and ids[2][:75] == ids[1]  # fits; then grew by less than the output
    assert not set(ids[3]) & set(ids[2])  # shrank: a new context
    assert ids[4][:25] == ids[3]  # and the next call chains on it
    assert all(call.block_size == 16 for call in a.calls)
    assert (counts.fits, counts.trimmed, counts.shrank, counts.first_calls, counts.tasks) == (3, 1, 1, 3, 3)
    sub = a.subtasks[0].task
    assert sub.calls[1].hash_ids[:18] == sub.calls[0].hash_ids and not set(sub.calls[0].hash_ids) & set(ids[0])
    assert not set(b.calls[0].hash_ids) & set(ids[0])  # tasks share nothing the counts cannot show
    assert c == _lengths_only().tasks[2] and counts.recorded == 1
    note = wl.provenance[0].notes[-1]
    assert "of 5 calls after a first call, 3 fit" in note and "1 grew by less" in note and "1 broke it" in note
    assert wl.provenance[0].options["assume_append_only"] is True


def test_inspect_shows_the_assumed_reuse(tmp_path):
    path = FIXTURES / "burstgpt_sessions.csv"
    before = workload_stats(load([path])).prefix_reuse
    after = workload_stats(load([path], assume_append_only=True)).prefix_reuse
    assert before.hashed_input_share == 0 and after.hashed_input_share == 1.0 and after.within_task > 0
    out = subprocess.run([sys.executable, "-m", "simulator", "trace", "inspect", str(path), "--assume-append-only",
                          "--json"], capture_output=True, text=True, check=True).stdout
    reuse = json.loads(out)["prefix_reuse"]
    assert reuse["within_task"] == pytest.approx(after.within_task)


@pytest.mark.parametrize("command", [["trace", "convert"], ["transform"]])
def test_convert_and_transform_write_the_assumed_ids(tmp_path, command):
    out = tmp_path / "w.jsonl"
    subprocess.run([sys.executable, "-m", "simulator", *command, str(FIXTURES / "burstgpt_sessions.csv"),
                    "-o", str(out), "--assume-append-only"], capture_output=True, text=True, check=True)
    wl = load([out])
    assert all(c.hash_ids for c in wl.all_calls()) and wl.provenance[0].options["assume_append_only"] is True


def test_fit_reads_the_assumed_reuse(tmp_path):
    """With the assumption the fit sees hash ids, so the model's block size is theirs, not the default."""
    block_sizes = {}
    for flag in ([], ["--assume-append-only"]):
        out = tmp_path / f"m{len(flag)}.yaml"
        subprocess.run([sys.executable, "-m", "simulator", "fit", str(FIXTURES / "burstgpt_sessions.csv"), "-o",
                        str(out), "--allow-fallback", *flag], capture_output=True, text=True, check=True)
        block_sizes[bool(flag)] = {c.structure.block_size for c in load_model(out).classes.values()}
    ids = load([FIXTURES / "burstgpt_sessions.csv"], assume_append_only=True).all_calls()
    size = next(c.block_size for c in ids if c.hash_ids)
    assert size != 64 and size in block_sizes[True] and size not in block_sizes[False]


def test_the_scenario_key_applies_the_assumption(tmp_path):
    text = f"workload:\n  trace: {FIXTURES / 'burstgpt_sessions.csv'}\n  assume_append_only: true\n"
    wl = sc.load_workload(sc.parse(text, str(tmp_path / "s.yaml")))
    assert all(c.hash_ids for c in wl.all_calls())
    plain = sc.load_workload(sc.parse(f"workload: {{trace: {FIXTURES / 'burstgpt_sessions.csv'}}}\n", str(tmp_path / "s.yaml")))
    assert not any(c.hash_ids for c in plain.all_calls())
    with pytest.raises(Exception) as err:
        sc.parse(text.replace("true", "sometimes"), str(tmp_path / "s.yaml"))
    assert "assume_append_only" in str(err.value)
