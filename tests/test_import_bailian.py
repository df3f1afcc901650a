"""Bailian importer: the shipped sample against counts computed from its raw lines, parent links turned into
tasks and branch sub-tasks, per-file hash id namespaces, and bad lines named by file, line and field."""

import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.traces import bailian, detect, importers, load, native
from simulator.traces.prefix import namespace

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "bailian" / "bailian_sample_from_format.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _row(chat, parent, ts, n_in=64, n_out=8, hashes=(1, 2, 3, 4), kind="text", turn=1):
    return {"chat_id": chat, "parent_chat_id": parent, "timestamp": ts, "input_length": n_in, "output_length": n_out,
            "type": kind, "turn": turn, "hash_ids": list(hashes)}


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_sample_counts_match_its_raw_lines():
    rows = _rows(SAMPLE)
    chats = {r["chat_id"] for r in rows}
    children: dict[int, int] = {}
    for r in rows:
        children[r["parent_chat_id"]] = children.get(r["parent_chat_id"], 0) + 1
    starts = [r for r in rows if r["parent_chat_id"] == -1 or r["parent_chat_id"] not in chats]
    branches = sum(n - 1 for parent, n in children.items() if parent in chats)

    wl = load([SAMPLE])
    tasks, calls, subtasks = wl.counts()
    assert (tasks, calls, subtasks) == (len(starts), len(rows), branches)
    assert branches > 0  # the sample has branches to turn into sub-tasks
    # what traces/README.md says of it
    assert (len(rows), len(starts), branches) == (24, 7, 2)
    assert (sum(r["input_length"] for r in rows), sum(r["output_length"] for r in rows)) == (54_498, 7_348)
    every = list(wl.all_calls())
    assert sum(c.input_tokens for c in every) == sum(r["input_length"] for r in rows)
    assert sum(c.output_tokens for c in every) == sum(r["output_length"] for r in rows)
    base = namespace(f"bailian:{SAMPLE.name}")
    assert sorted(tuple(c.hash_ids) for c in every) == sorted(tuple(base | h for h in r["hash_ids"]) for r in rows)
    assert {c.block_size for c in every} == {16}
    assert {t.task_class for t in wl.all_tasks()} == {r["type"] for r in rows}
    assert [t.arrival for t in wl.tasks] == sorted(r["timestamp"] - rows[0]["timestamp"] for r in starts)


def test_parent_links_become_turns_and_branches(tmp_path):
    path = _write(tmp_path / "b.jsonl", [
        _row(10, -1, 1.0, hashes=(1, 2)),
        _row(11, 10, 4.0, n_in=96, hashes=(1, 2, 3), turn=2),  # first child: the next turn
        _row(12, 10, 6.5, n_in=80, hashes=(1, 2, 9), kind="search", turn=2),  # second child: a branch
        _row(13, 12, 9.0, n_in=120, hashes=(1, 2, 9, 10), turn=3),  # continues the branch
        _row(14, 999, 2.0, hashes=(50,), turn=4),  # its parent is not in the file
    ])
    wl = load([path])
    by_id = {t.id: t for t in wl.tasks}
    assert sorted(by_id) == ["bailian-10", "bailian-14"]
    task = by_id["bailian-10"]
    assert [c.input_tokens for c in task.calls] == [64, 96]
    assert [c.gap for c in task.calls] == [0.0, 3.0] and [c.sent_at for c in task.calls] == [0.0, 3.0]
    (sub,) = task.subtasks
    assert (sub.after_call, sub.wait, sub.task.id, sub.task.task_class) == (0, False, "bailian-10/12", "search")
    assert [c.input_tokens for c in sub.task.calls] == [80, 120]
    assert [c.gap for c in sub.task.calls] == [5.5, 2.5]
    base = namespace("bailian:b.jsonl")
    assert sub.task.calls[1].hash_ids == tuple(base | h for h in (1, 2, 9, 10))
    assert by_id["bailian-14"].arrival == 1.0
    notes = " ".join(wl.provenance[0].notes)
    assert "1 requests name a parent chat that is not in the file" in notes
    assert "includes the parent's service time" in notes


def test_two_files_never_share_blocks(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row(1, -1, 0.0)])
    b = _write(tmp_path / "b.jsonl", [_row(1, -1, 0.0)])
    ids = [set(c.hash_ids) for c in load([tmp_path]).all_calls()]
    assert len(ids) == 2 and not ids[0] & ids[1]
    assert load([a]).tasks[0].calls[0].hash_ids != load([b]).tasks[0].calls[0].hash_ids


def test_sniffing_keeps_formats_apart():
    assert detect(SAMPLE) is bailian
    # a Bailian line has Mooncake's four fields too: bailian must be asked first
    order = list(importers())
    head = SAMPLE.read_bytes()[:65536]
    assert [m.FORMAT for m in importers().values() if m.sniff(SAMPLE, head)] == ["bailian", "mooncake"]
    assert order.index("bailian") < order.index("mooncake")
    for sample in sorted((ROOT / "traces").rglob("*")) + sorted((ROOT / "tests" / "fixtures").glob("*")):
        if sample.is_file() and sample.parent.name != "bailian":
            assert not bailian.sniff(sample, sample.read_bytes()[:65536]), sample


def test_sample_round_trips_through_native(tmp_path):
    wl = load([SAMPLE])
    native.write(wl, tmp_path / "w.jsonl")
    again = load([tmp_path / "w.jsonl"])
    assert again.tasks == wl.tasks and again.provenance == wl.provenance


GOOD = json.dumps(_row(1, -1, 0.0))


@pytest.mark.parametrize("line, field, words", [
    (json.dumps({k: v for k, v in _row(2, -1, 1.0).items() if k != "output_length"}), "output_length", "missing"),
    (json.dumps(_row(2, -1, 1.0, n_in="64")), "input_length", "whole number"),
    (json.dumps(_row(2, -1, 1.0, n_out=-3)), "output_length", "negative"),
    (json.dumps(_row(2, -1, -1.0)), "timestamp", "from 0"),
    (json.dumps(_row(2, -1, "soon")), "timestamp", "number of seconds"),
    (json.dumps(_row(-2, -1, 1.0)), "chat_id", "negative"),
    (json.dumps(_row(2, -5, 1.0)), "parent_chat_id", "-1 or more"),
    (json.dumps(_row(2, 2, 1.0)), "parent_chat_id", "its own parent"),
    (json.dumps(_row(2, -1, 1.0, hashes=(1, "x"))), "hash_ids", "integer block ids"),
    (json.dumps(_row(2, -1, 1.0, hashes=(1, -4))), "hash_ids", "integer block ids"),
    (json.dumps(_row(2, -1, 1.0, hashes=(2**32,))), "hash_ids", "integer block ids"),
    (json.dumps(_row(2, -1, 1.0, kind=7)), "type", "string"),
    (json.dumps(_row(2, -1, 1.0, turn=-1)), "turn", "whole number"),
    (json.dumps(_row(1, -1, 1.0)), "chat_id", "appears twice (first on line 1)"),
])
def test_bad_line_names_file_line_and_field(tmp_path, line, field, words):
    path = _write(tmp_path / "bad.jsonl", [GOOD, line, json.dumps(_row(3, -1, 2.0))])
    with pytest.raises(InputError) as err:
        load([path], format="bailian")
    text = str(err.value)
    assert err.value.line == 2 and err.value.field == field, text
    assert "bad.jsonl:2" in text and f"field '{field}'" in text and words in text


def test_bad_json_and_empty_file(tmp_path):
    path = _write(tmp_path / "cut.jsonl", [GOOD, GOOD[:30]])
    with pytest.raises(InputError, match=r"cut\.jsonl:2: not JSON"):
        load([path], format="bailian")
    empty = _write(tmp_path / "empty.jsonl", [])
    with pytest.raises(InputError, match="no requests found"):
        load([empty], format="bailian")


def test_child_before_parent_and_loops_are_bad(tmp_path):
    early = _write(tmp_path / "early.jsonl", [_row(1, -1, 5.0), _row(2, 1, 4.0)])
    with pytest.raises(InputError) as err:
        load([early])
    assert (err.value.line, err.value.field) == (2, "timestamp") and "earlier than its parent chat 1" in str(err.value)
    loop = _write(tmp_path / "loop.jsonl", [_row(1, -1, 0.0), _row(2, 3, 5.0), _row(3, 2, 5.0)])
    with pytest.raises(InputError) as err:
        load([loop])
    assert (err.value.line, err.value.field) == (2, "parent_chat_id") and "loop" in str(err.value)


def test_skip_leaves_bad_lines_out_and_says_so(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [
        GOOD,
        json.dumps(_row(2, 1, 1.0, n_out=-1)),  # bad: its child 3 then starts a task of its own
        json.dumps(_row(3, 2, 2.0)),
        "{not json",
        json.dumps(_row(4, 1, 3.0)),
    ])
    wl = load([path], on_error="skip")
    assert sorted(t.id for t in wl.tasks) == ["bailian-1", "bailian-3"]
    assert [c.gap for c in wl.tasks[0].calls] == [0.0, 3.0]
    notes = " ".join(wl.provenance[0].notes)
    assert "skipped 1 record(s): output_length: negative token count" in notes
    assert "not JSON" in notes and "1 requests name a parent chat that is not in the file" in notes
