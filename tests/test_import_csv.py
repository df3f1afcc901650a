"""CSV importers (Azure LLM inference, BurstGPT): counts and exact fields against the raw rows, arrival
order, sessions and failures, native round trip, and errors naming file, line and column."""

import csv
from datetime import datetime
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.traces import azure, burstgpt, detect, load, native

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
AZURE_SAMPLE = ROOT / "traces" / "azure-2023"
AZURE_FULL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-2023" / "AzureLLMInferenceTrace_code.csv"
needs_full = pytest.mark.skipif(not AZURE_FULL.is_file(), reason="shared Azure trace not present")


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))[1:]


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text[:26]).timestamp() + int(text[26:] or 0) * 1e-7


# ---- Azure ----------------------------------------------------------------------------------------

@needs_full
def test_azure_whole_file_counts_fields_and_order():
    rows = _rows(AZURE_FULL)
    wl = load([AZURE_FULL])
    assert wl.counts() == (len(rows), len(rows), 0)
    assert wl.provenance[0].format == "azure"
    t0 = _seconds(rows[0][0])
    for index in (0, 1, 2, 1234, len(rows) - 1):
        task = wl.tasks[index]
        assert task.id == f"azure-{index:06d}"
        assert (task.calls[0].input_tokens, task.calls[0].output_tokens) == (int(rows[index][1]), int(rows[index][2]))
        assert task.arrival == pytest.approx(_seconds(rows[index][0]) - t0, abs=1e-6)
    assert wl.tasks[1].arrival == 0.052  # 18:17:04.0319600 - 18:17:03.9799600, exact at 100 ns resolution
    arrivals = [t.arrival for t in wl.tasks]
    assert arrivals == sorted(arrivals)
    assert 3400 < arrivals[-1] < 3600  # one hour of traffic


def test_azure_sample_detected_round_trips_and_is_bursty(tmp_path):
    data = next(AZURE_SAMPLE.glob("*.csv"))
    assert detect(data) is azure
    wl = load([AZURE_SAMPLE])  # the LICENSE beside the data is not read as a trace
    assert wl.counts()[0] == len(_rows(data)) == 1000
    gaps = [b.arrival - a.arrival for a, b in zip(wl.tasks, wl.tasks[1:])]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert cv > 5  # the excerpt was picked for its bursts
    native.write(wl, tmp_path / "w.jsonl")
    again = load([tmp_path / "w.jsonl"])
    assert again.tasks == wl.tasks and again.provenance == wl.provenance


def test_azure_timestamp_variants(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 23:59:59.9000000+00:00,10,1\n"
        "2024-05-11T00:00:00.4,20,2\n"
        "2024-05-11 02:00:00.500000+02:00,30,3\n"
    )
    wl = load([path])
    assert [t.arrival for t in wl.tasks] == [0.0, 0.5, 0.6]
    assert [t.calls[0].input_tokens for t in wl.tasks] == [10, 20, 30]


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_GOOD = "2023-11-16 18:17:03.9799600,4808,10\n"


@pytest.mark.parametrize(
    "row, field, words",
    [
        ("2023-11-16 18:17:04.0000000,many,10", "ContextTokens", "whole number"),
        ("2023-11-16 18:17:04.0000000,4808,-3", "GeneratedTokens", "negative"),
        ("2023-11-16 18:17:02.0000000,4808,3", "TIMESTAMP", "backwards"),
        ("yesterday,4808,3", "TIMESTAMP", "not a timestamp"),
        ("2023-11-16 18:17:04.0000000,4808", "GeneratedTokens", "fields"),
    ],
)
def test_azure_bad_row_names_file_line_and_column(tmp_path, row, field, words):
    path = tmp_path / "bad.csv"
    path.write_text(AZURE_HEADER + AZURE_GOOD + row + "\n" + AZURE_GOOD)
    with pytest.raises(InputError) as err:
        load([path], format="azure")
    text = str(err.value)
    assert "bad.csv:3" in text and f"field '{field}'" in text and words in text


def test_azure_missing_column_and_empty_file(tmp_path):
    path = tmp_path / "cols.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n")
    with pytest.raises(InputError, match=r"cols\.csv:1: field 'GeneratedTokens': missing column"):
        load([path], format="azure")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputError, match=r"empty\.csv"):
        load([empty], format="azure")
    with pytest.raises(InputError, match=r"empty\.csv"):
        load([empty])


def test_azure_skip_mode_counts(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        AZURE_HEADER + AZURE_GOOD
        + "2023-11-16 18:17:01.0000000,4808,3\n"  # backwards
        + "2023-11-16 18:17:05.0000000,x,3\n"
        + "2023-11-16 18:17:02.0000000,4808,3\n"  # backwards too: counted under the same reason
        + "2023-11-16 18:17:06.0000000,5,3\n"
    )
    wl = load([path], on_error="skip")
    assert [t.id for t in wl.tasks] == ["azure-000000", "azure-000004"]
    assert wl.tasks[1].arrival == pytest.approx(2.02004)
    notes = " ".join(wl.provenance[0].notes)
    assert "skipped 2 record(s): TIMESTAMP" in notes and "skipped 1 record(s): ContextTokens" in notes


# ---- BurstGPT -------------------------------------------------------------------------------------

def test_burstgpt_single_requests_and_failures():
    path = FIXTURES / "burstgpt.csv"
    assert detect(path) is burstgpt
    wl = load([path])
    rows = _rows(path)
    kept = [(i, r) for i, r in enumerate(rows) if r[3] != "0"]
    assert len(kept) == len(rows) - 1
    assert [t.id for t in wl.tasks] == [f"burstgpt-{i:06d}" for i, _ in kept]
    for task, (_, row) in zip(wl.tasks, kept):
        call = task.calls[0]
        assert len(task.calls) == 1
        assert (call.input_tokens, call.output_tokens, call.model) == (int(row[2]), int(row[3]), row[1])
        assert task.arrival == float(row[0]) - float(rows[0][0])
        assert task.task_class == {"Conversation log": "conversation", "API log": "api"}[row[5]]
    assert "left out 1 failed requests (Response tokens 0)" in wl.provenance[0].notes


def test_burstgpt_sessions(tmp_path):
    path = FIXTURES / "burstgpt_sessions.csv"
    wl = load([path])
    by_id = {t.id: t for t in wl.tasks}
    assert set(by_id) == {"burstgpt-sa91f", "burstgpt-sc07e", "burstgpt-000001"}
    a91f = by_id["burstgpt-sa91f"]
    # rows at 10, 31, 52 (failed: Response tokens 0) and 77 s
    assert [(c.input_tokens, c.output_tokens) for c in a91f.calls] == [(312, 120), (498, 205), (990, 61)]
    assert [c.gap for c in a91f.calls] == [0.0, 21.0, 46.0]
    assert [c.sent_at for c in a91f.calls] == [0.0, 21.0, 67.0]
    assert a91f.arrival == 0.0 and a91f.task_class == "conversation"
    assert by_id["burstgpt-sc07e"].arrival == 30.0 and [c.gap for c in by_id["burstgpt-sc07e"].calls] == [0.0, 50.0]
    single = by_id["burstgpt-000001"]
    assert single.arrival == 2.0 and single.task_class == "api" and single.calls[0].model == "GPT-4"
    assert [t.arrival for t in wl.tasks] == sorted(t.arrival for t in wl.tasks)
    assert any("grouped 5 requests into 2 sessions" in n for n in wl.provenance[0].notes)
    native.write(wl, tmp_path / "w.jsonl")
    assert load([tmp_path / "w.jsonl"]).tasks == wl.tasks


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_GOOD = "5,ChatGPT,472,18,490,Conversation log\n"


@pytest.mark.parametrize(
    "row, field, words",
    [
        ("9,ChatGPT,lots,18,490,Conversation log", "Request tokens", "whole number"),
        ("9,ChatGPT,472,-18,490,Conversation log", "Response tokens", "negative"),
        ("2,ChatGPT,472,18,490,Conversation log", "Timestamp", "backwards"),
        ("later,ChatGPT,472,18,490,Conversation log", "Timestamp", "seconds"),
    ],
)
def test_burstgpt_bad_row_names_file_line_and_column(tmp_path, row, field, words):
    path = tmp_path / "bad.csv"
    path.write_text(BURST_HEADER + BURST_GOOD + row + "\n" + BURST_GOOD.replace("5,", "10,", 1))
    with pytest.raises(InputError) as err:
        load([path], format="burstgpt")
    text = str(err.value)
    assert "bad.csv:3" in text and f"field '{field}'" in text and words in text


def test_burstgpt_missing_column_empty_file_and_skip(tmp_path):
    path = tmp_path / "cols.csv"
    path.write_text("Timestamp,Model,Request tokens,Total tokens\n5,ChatGPT,472,490\n")
    with pytest.raises(InputError, match=r"cols\.csv:1: field 'Response tokens': missing column"):
        load([path], format="burstgpt")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputError, match=r"empty\.csv"):
        load([empty], format="burstgpt")
    bad = tmp_path / "bad.csv"
    bad.write_text(BURST_HEADER + BURST_GOOD + "1,ChatGPT,4,1,5,API log\n" + "7,ChatGPT,-4,1,5,API log\n"
                   + "8,GPT-4,40,2,42,API log\n")
    wl = load([bad], on_error="skip")
    assert [(t.arrival, t.calls[0].input_tokens) for t in wl.tasks] == [(0.0, 472), (3.0, 40)]
    notes = " ".join(wl.provenance[0].notes)
    assert "skipped 1 record(s): Timestamp" in notes and "skipped 1 record(s): Request tokens" in notes


# ---- encodings and bounds (issue 17) ---------------------------------------------------------------

BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_a_latin1_export_is_read_and_the_notes_say_so(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes((BURST + "5,ChatGPT caf\xe9,10,20,30,Conversation log\n").encode("latin-1"))
    wl = load([path])
    assert wl.tasks[0].calls[0].model == "ChatGPT caf\xe9"  # the byte 0xE9 read as Latin-1
    assert any("read as Latin-1" in note for note in wl.provenance[0].notes)
    utf8 = tmp_path / "utf8.csv"
    utf8.write_text(BURST + "5,ChatGPT caf\xe9,10,20,30,Conversation log\n", encoding="utf-8")
    assert load([utf8]).tasks == wl.tasks and not any("Latin-1" in n for n in load([utf8]).provenance[0].notes)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig", "utf-32"])
def test_a_file_with_a_byte_order_mark_is_read_in_its_encoding(tmp_path, encoding):
    path = tmp_path / "azure.csv"
    path.write_bytes("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,20\n".encode(encoding))
    assert detect(path) is azure  # sniffed through its encoding
    assert load([path]).tasks[0].calls[0].input_tokens == 100


def test_utf16_without_a_bom_is_an_input_error_naming_the_line(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_bytes("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,100,20\n".encode("utf-16-le"))
    with pytest.raises(InputError) as err:
        load([path], format="azure")
    assert err.value.line == 1 and "NUL" in str(err.value)


def test_a_field_too_long_for_a_row_is_an_input_error(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text(BURST + '5,"' + "x" * 200_000 + '",10,20,30,Conversation log\n')
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 2 and "CSV row" in str(err.value)


@pytest.mark.parametrize("cell, words", [("16777217", "more than the 16,777,216"), ("1e400", "whole number"),
                                         ("9" * 5000, "whole number")])
def test_token_counts_beyond_the_cap_are_input_errors(tmp_path, cell, words):
    path = tmp_path / "big.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,{cell},20\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 2 and err.value.field == "ContextTokens" and words in str(err.value)


def test_timestamps_out_of_range_are_input_errors(tmp_path):
    path = tmp_path / "far.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0001-01-01 00:00:00+23:59,1,2\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.field == "TIMESTAMP"
    late = tmp_path / "late.csv"
    late.write_text(BURST + "-9e8,m,1,2,3,API log\n9e8,m,1,2,3,API log\n")
    with pytest.raises(InputError) as err:
        load([late])
    assert err.value.line == 3 and "after the first row" in str(err.value)
