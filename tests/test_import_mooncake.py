"""Mooncake importer: session joining checked against a naive re-implementation of the rule, exact fields
against the raw lines, arrival order, native round trip, and errors naming file, line and field."""

import json
from pathlib import Path

import pytest

from simulator.errors import ErrorPolicy, InputError
from simulator.traces import detect, load, mooncake, native

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "mooncake"
FULL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
needs_full = pytest.mark.skipif(not FULL.is_file(), reason="shared Mooncake trace not present")


def _naive_groups(rows: list[dict]) -> list[list[int]]:
    """The joining rule written the slow, obvious way: compare with every earlier request."""
    keys = [tuple(r["hash_ids"][: r["input_length"] // 512]) for r in rows]
    task_of: list[int] = []
    groups: list[list[int]] = []
    latest: dict[int, int] = {}  # task -> its latest request
    for j, row in enumerate(rows):
        chain = tuple(row["hash_ids"])
        best = None
        for i in range(j):  # the longest key wins; among equal keys the latest request
            k = len(keys[i])
            if 2 <= k < len(chain) and chain[:k] == keys[i] and rows[i]["input_length"] < row["input_length"]:
                if best is None or k >= len(keys[best]):
                    best = i
        if best is not None and latest[task_of[best]] == best:
            task = task_of[best]
            groups[task].append(j)
        else:
            task = len(groups)
            groups.append([j])
        task_of.append(task)
        latest[task] = j
    return groups


def _lines(path: Path, n: int | None = None) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for _, line in zip(range(n or 10**9), fh) if line.strip()]


def _read(path: Path, on_error="raise"):
    policy = ErrorPolicy(on_error)
    return mooncake.read(path, policy), policy


@needs_full
def test_sessions_match_naive_rule_on_first_2000_lines(tmp_path):
    rows = _lines(FULL, 2000)
    head = tmp_path / "head.jsonl"
    head.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wl, _ = _read(head)
    expected = _naive_groups(rows)
    multi = [g for g in expected if len(g) > 1]
    assert len(multi) > 20  # the excerpt really has conversations to join
    assert len(wl.tasks) == len(expected)
    t0 = rows[0]["timestamp"]

    def turns(group):
        return [(rows[i]["timestamp"] - t0, tuple(rows[i]["hash_ids"])) for i in group]

    got = []
    for task in wl.tasks:
        start = task.arrival * 1000
        got.append([(round(start + c.sent_at * 1000), c.hash_ids) for c in task.calls])
    assert sorted(got) == sorted(turns(g) for g in expected)
    joined = sum(len(g) for g in multi)
    assert wl.provenance[0].notes[0].startswith(f"joined {joined} of {len(rows)} requests into {len(multi)} ")


@needs_full
def test_whole_file_counts_and_fields():
    rows = _lines(FULL)
    wl, _ = _read(FULL)
    n_tasks, n_calls, n_subs = wl.counts()
    assert n_calls == len(rows) and n_subs == 0
    assert 1 < len(rows) / n_tasks < 3  # conversations were rebuilt, but most requests stay single
    first = wl.tasks[0].calls[0]
    assert (first.input_tokens, first.output_tokens) == (rows[0]["input_length"], rows[0]["output_length"])
    assert first.hash_ids == tuple(rows[0]["hash_ids"]) and first.block_size == 512
    # every input/output pair of the file appears once, whatever task it went to
    got = sorted((c.input_tokens, c.output_tokens, c.hash_ids) for c in wl.all_calls())
    assert got == sorted((r["input_length"], r["output_length"], tuple(r["hash_ids"])) for r in rows)
    arrivals = [t.arrival for t in wl.tasks]
    assert arrivals == sorted(arrivals) and arrivals[-1] <= rows[-1]["timestamp"] / 1000


@needs_full
def test_gaps_are_times_between_sends():
    rows = _lines(FULL, 3000)
    sent = {tuple(r["hash_ids"]): r["timestamp"] / 1000 for r in rows}
    repeated = len(rows) - len(sent)
    assert repeated < 100
    seen: set = set()
    dupes = {c for c in (tuple(r["hash_ids"]) for r in rows) if c in seen or seen.add(c)}
    wl, _ = _read(FULL)
    checked = 0
    for task in wl.tasks:
        chains = [c.hash_ids for c in task.calls]
        if len(chains) < 3 or any(c not in sent or c in dupes for c in chains):
            continue
        times = [sent[c.hash_ids] for c in task.calls]
        assert [c.gap for c in task.calls] == pytest.approx([0.0] + [b - a for a, b in zip(times, times[1:])])
        assert [c.sent_at for c in task.calls] == pytest.approx([t - times[0] for t in times])
        assert task.arrival == pytest.approx(times[0])
        # each turn extends the previous one's full blocks
        for a, b in zip(task.calls, task.calls[1:]):
            key = a.hash_ids[: a.input_tokens // 512]
            assert b.hash_ids[: len(key)] == key and b.input_tokens > a.input_tokens
        checked += 1
    assert checked >= 10
    assert "previous call's service time" in " ".join(wl.provenance[0].notes)


def test_one_shared_block_does_not_join(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 900, "output_length": 5, "hash_ids": [0, 1]},  # key (0,): too short
        {"timestamp": 1000, "input_length": 1500, "output_length": 5, "hash_ids": [0, 2, 3]},
        {"timestamp": 2000, "input_length": 1400, "output_length": 5, "hash_ids": [0, 2, 4]},  # key (0, 2)
        {"timestamp": 3000, "input_length": 2000, "output_length": 5, "hash_ids": [0, 2, 4, 5]},  # joins line 3
        {"timestamp": 4000, "input_length": 2100, "output_length": 5, "hash_ids": [0, 2, 8, 9, 10]},  # branch off line 3
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    wl, _ = _read(path)
    assert [[c.input_tokens for c in t.calls] for t in wl.tasks] == [[900], [1500], [1400, 2000], [2100]]
    assert wl.tasks[2].calls[1].gap == 1.0 and wl.tasks[2].arrival == 2.0
    assert any("1 requests extended an already-continued" in n for n in wl.provenance[0].notes)


def test_sample_is_detected_and_round_trips(tmp_path):
    wl = load([SAMPLE])
    assert detect(next(SAMPLE.glob("*.jsonl"))) is mooncake
    assert wl.counts()[1] == len(_lines(next(SAMPLE.glob("*.jsonl"))))
    native.write(wl, tmp_path / "w.jsonl")
    again = load([tmp_path / "w.jsonl"])
    assert again.tasks == wl.tasks and again.provenance == wl.provenance


GOOD = '{"timestamp": 0, "input_length": 900, "output_length": 5, "hash_ids": [0, 1]}\n'


@pytest.mark.parametrize(
    "line, field, words",
    [
        ('{"timestamp": 5, "input_length": 900, "hash_ids": [0, 1]}', "output_length", "missing"),
        ('{"timestamp": 5, "input_length": "900", "output_length": 5, "hash_ids": [0, 1]}', "input_length", "whole number"),
        ('{"timestamp": 5, "input_length": 900, "output_length": -5, "hash_ids": [0, 1]}', "output_length", "negative"),
        ('{"timestamp": "soon", "input_length": 900, "output_length": 5, "hash_ids": [0]}', "timestamp", "number"),
        ('{"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [0, "x"]}', "hash_ids", "integer"),
        ('{"timestamp": -1, "input_length": 900, "output_length": 5, "hash_ids": [0, 1]}', "timestamp", "backwards"),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path, line, field, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + line + "\n" + GOOD)
    with pytest.raises(InputError) as err:
        load([path], format="mooncake")
    text = str(err.value)
    assert "bad.jsonl:2" in text and f"field '{field}'" in text and words in text


def test_truncated_json_and_empty_file(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text(GOOD + GOOD[:40] + "\n")
    with pytest.raises(InputError, match=r"cut\.jsonl:2: not JSON"):
        load([path], format="mooncake")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="empty.jsonl"):
        load([empty])
    with pytest.raises(InputError, match="empty.jsonl: no requests"):
        load([empty], format="mooncake")


def test_skip_mode_counts_bad_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    later = GOOD.replace('"timestamp": 0', '"timestamp": 9000')
    path.write_text(
        later
        + GOOD  # goes backwards
        + '{"timestamp": 9500, "input_length": -1, "output_length": 5, "hash_ids": [0]}\n'
        + later[:30] + "\n"
        + later
    )
    wl = load([path], on_error="skip")
    assert wl.counts()[1] == 2
    notes = " ".join(wl.provenance[0].notes)
    assert "skipped 1 record(s): timestamp" in notes and "skipped 1 record(s): input_length" in notes
    assert "not JSON" in notes


@pytest.mark.parametrize("line, field", [
    ('{"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [true, false]}', "hash_ids"),
    ('{"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [0, 1.0]}', "hash_ids"),
    ('{"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [0, -3]}', "hash_ids"),
    ('{"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [9223372036854775808]}', "hash_ids"),
    ('{"timestamp": 5, "input_length": 9223372036854775808, "output_length": 5, "hash_ids": [0]}', "input_length"),
    ('{"timestamp": 5, "input_length": 900, "output_length": 16777217, "hash_ids": [0]}', "output_length"),
    ('{"timestamp": 1e13, "input_length": 900, "output_length": 5, "hash_ids": [0]}', "timestamp"),
])
def test_values_out_of_range_are_input_errors(tmp_path, line, field):
    """Booleans are not block ids, nor are floats or negative numbers; counts and times stay in range."""
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + line + "\n")
    with pytest.raises(InputError) as err:
        load([path], format="mooncake")
    assert err.value.line == 2 and err.value.field == field


def test_turns_of_a_session_share_their_hash_ids(tmp_path):
    wl = load([next(SAMPLE.glob("*.jsonl"))])
    multi = [t for t in wl.tasks if len(t.calls) > 1]
    assert multi
    for task in multi:
        first, second = task.calls[:2]
        shared = first.hash_ids[: len(first.hash_ids) - 1]  # the last block is partial, hashed again next turn
        assert second.hash_ids[: len(shared)] == shared
    # a turn re-hashes the previous turn's last block, so it starts a chain of its own, copying the runs of
    # consecutive ids it keeps: a few entries, not its ids one by one
    ids = sum(len(c.hash_ids) for t in wl.tasks for c in t.calls)
    runs = sum(len(list(c.hash_ids.runs())) for t in wl.tasks for c in t.calls if c.hash_ids)
    assert runs * 5 < ids
