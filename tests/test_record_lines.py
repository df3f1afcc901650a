"""A record's line in calls.jsonl and tasks.jsonl (`results.record_line`, what `ResultWriter` and a
shard's appended records write) reads back as the same JSON values as the `json.dumps` line of the same
record, NaN and infinities, integers past 64 bits and characters orjson refuses included."""

from __future__ import annotations

import json
import math

import pytest

from simulator.metrics import results
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.metrics.results import ResultWriter, Window
from simulator.scale import parts


def dumped(record) -> bytes:
    """The line as it was written before orjson: json.dumps of the record's dict."""
    return (json.dumps(results.record_dict(record)) + "\n").encode()


def canonical(line: bytes) -> str:
    """A line's JSON values in one spelling (json.dumps of them parsed: 1 and 1.0 differ, NaN is NaN)."""
    return json.dumps(json.loads(line))


CALL = CallRecord("t1", "code", 2, 1, 0.1, 0.1000001, 1e-7 + 3.25, True, ttft=0.012345678901234567, itl_count=41,
                  itl_mean=1 / 3, itl_max=2.5e-5, input_tokens=123_456, output_tokens=42, requested_output_tokens=64,
                  cached_tokens=0, status=200, retry_after=None)
RECORDS = [
    CALL,
    CallRecord("t2", "ünïcode ☃", 0, 0, 0.0, -0.0, 1e300, False, status=503, error_class="http_5xx",
               error_message='quote " backslash \\ tab \t newline \n nul \x00 emoji 🦀', retry_after=5.0),
    CallRecord("t3", "c", 0, 0, 5e-324, 1.7976931348623157e308, 86400.0, True, replica="r7"),
    CallRecord("t4", "c", 0, 0, 1.0, 2.0, 3.0, True, itl_mean=float("nan"), itl_max=float("inf"),
               retry_after=-math.inf),
    CallRecord("t5", "c", 0, 0, 1.0, 2.0, 3.0, True, cached_tokens=2**70, input_tokens=-(2**64)),
    CallRecord("t6", "c", 0, 0, 1.0, 2.0, 3.0, False, error_message="a lone surrogate \udc80 from a body"),
    CallRecord("t7", "null", 0, 0, 1.0, 2.0, 3.0, False, error_message='{"error": null}'),
    CallRecord("t8", "null", 0, 0, 1.0, 2.0, 3.0, False, error_message="null", itl_max=float("nan")),
    TaskRecord("t1", "code", 0.5, 12.75, True, 3, 3, 10.0, 2.0, 0.001),
    TaskRecord("t1.sub", "code", 0.5, 1e-9, False, 0, 3, 0.0, 0.0, 0.0, parent_id="t1", failed_call=0,
               error_class="cancelled", time_in_ttft=0.1 + 0.2),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.task_id + type(r).__name__)
def test_a_records_line_reads_back_as_the_json_dumps_line_did(record):
    line = results.record_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert canonical(line) == canonical(dumped(record))
    assert list(json.loads(line)) == list(json.loads(dumped(record)))  # the keys in the same order
    assert ("replica" in json.loads(line)) == (getattr(record, "replica", None) is not None)


def test_a_plain_records_line_is_orjsons_and_one_orjson_cannot_write_is_json_dumps():
    for record in (CALL, RECORDS[6]):  # orjson's (no spaces), "null" in a string too
        assert results.record_line(record) != dumped(record)
    for record in RECORDS[3:6] + RECORDS[7:8]:  # NaN and infinities, integers past 64 bits, a lone surrogate
        assert results.record_line(record) == dumped(record)


def test_the_writer_and_a_shards_appended_tasks_write_record_lines_that_read_back(tmp_path):
    calls = [r for r in RECORDS if isinstance(r, CallRecord)]
    tasks = [r for r in RECORDS if isinstance(r, TaskRecord)]
    with ResultWriter(tmp_path, Window()) as writer:
        for c in calls:
            writer.call(c)
        writer.task(tasks[0])
    parts.append_tasks(tmp_path, tasks[1:])
    assert (tmp_path / results.CALLS_FILE).read_bytes() == b"".join(map(results.record_line, calls))
    assert (tmp_path / results.TASKS_FILE).read_bytes() == b"".join(map(results.record_line, tasks))
    old = tmp_path / "old"  # the same records as json.dumps wrote them: read back the same
    old.mkdir()
    (old / results.CALLS_FILE).write_bytes(b"".join(map(dumped, calls)))
    (old / results.TASKS_FILE).write_bytes(b"".join(map(dumped, tasks)))
    assert list(map(repr, results.read_calls(tmp_path))) == list(map(repr, results.read_calls(old)))
    assert results.read_tasks(tmp_path) == results.read_tasks(old) == tasks
