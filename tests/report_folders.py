"""Result folders for the report tests, made the way users make them: a short live run against the
built-in emulator (the twin of tiny-vllm-cpu, with /metrics and injected HTTP 500s), simulations of
the same workload, and the hand-made study.json in tests/fixtures/study.

The workload's task ids and classes are hostile on purpose: markup, quotes, ampersands and
matplotlib's math-mode dollar, as a trace from anywhere may hold them."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

from simulator.cli import main
from simulator.metrics import results
from simulator.metrics.records import CallRecord
from simulator.traces.native import write
from simulator.workload import Call, SubTask, Task, Workload

HOSTILE_CLASS = "<script>alert('class')</script>"
QUOTED_CLASS = "\"quoted\" & 'single' $x^2$ C:\\tmp"
HOSTILE_ID = "<img src=x onerror=alert(1)>\"'&"
HOSTILE_MESSAGE = "</td><script>alert('message')</script><b onmouseover=\"x\">"
STUDY_FIXTURE = Path(__file__).parent / "fixtures" / "study"


def workload(seed: int = 0) -> Workload:
    """Six short agent tasks in two classes, one with a sub-agent; `seed` shifts the arrivals (another
    seed: another workload)."""
    tasks = []
    for i in range(6):
        chain = tuple(Call(input_tokens=200 + 150 * j, output_tokens=8 + 4 * j, gap=0.15 if j else 0.0,
                           hash_ids=tuple(range(100 * i, 100 * i + j + 3)), block_size=64) for j in range(4))
        subs = (SubTask(1, Task(f"{i}-sub", (Call(input_tokens=120, output_tokens=6),),
                                task_class=HOSTILE_CLASS)),) if i == 0 else ()
        task_id = HOSTILE_ID if i == 1 else f"task-{i}"
        tasks.append(Task(task_id, chain, arrival=0.25 * i + 0.1 * seed,
                          task_class=HOSTILE_CLASS if i % 2 else QUOTED_CLASS, subtasks=subs))
    return Workload(tuple(tasks))


SCENARIO = """\
name: report-test
workload: {{trace: w.jsonl}}
emulator: {{profile: tiny-vllm-cpu, faults: ["http_500:0.12"], seed: 3}}
run: {{seed: 0, retries: 2, backoff: 0.05, scrape_interval: 0.1}}
slo:
  ttft_ms: {{p90: 200, p99: 400}}
  tpot_ms: {{p99: 50}}
  task_s: {{p90: {task_bound}}}
"""


def scenario(folder: Path, seed: int = 0, task_bound: float = 3.0) -> Path:
    """A scenario file (and its trace) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    write(workload(seed), folder / "w.jsonl")
    path = folder / "s.yaml"
    path.write_text(SCENARIO.format(task_bound=task_bound))
    return path


def live_run(tmp: Path) -> Path:
    """`agentload run` of the scenario on the emulator: a real result folder with errors and /metrics."""
    out = tmp / "live"
    code = main(["run", str(scenario(tmp / "scenario")), "-o", str(out), "--no-progress"])
    assert code in (0, 1), code  # 1: more failed attempts than allowed, by design of the faults
    return out


def simulation(tmp: Path, name: str, seed: int = 0, *extra: str) -> Path:
    """`agentload simulate` of the scenario (`seed` != 0: another workload) on tiny-vllm-cpu."""
    out = tmp / name
    assert main(["simulate", str(scenario(tmp / f"scenario-{name}", seed)), "-p", "tiny-vllm-cpu",
                 "-o", str(out), *extra]) == 0
    return out


def drained(tmp: Path, name: str = "drained", drain: float = 0.3, *extra: str) -> Path:
    """A simulation cut off by its drain limit: `drain` seconds after the last arrival, with at most two
    tasks at once, half the tasks are still running and are cancelled (partial, stop reason
    drain_timeout)."""
    return simulation(tmp, name, 0, "--set", f"run.drain={drain}", "--set", "run.max_in_flight=2", *extra)


KILLED_AT = 1.1
"""When `killed` pretends the run was killed: after the fifth task's arrival (1.0 s), before the sixth's."""


def killed(source: Path, folder: Path) -> Path:
    """`source` as a run killed at `KILLED_AT` seconds would have left it: only the records that had ended
    by then, progress.json with the tasks started, no summary.json; then the summary rebuilt from the
    records, as `agentload report` does (partial, tasks interrupted and never started)."""
    from simulator.metrics.summary import rebuild

    shutil.copytree(source, folder)
    for name in (results.CALLS_FILE, results.TASKS_FILE):
        lines = (folder / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / name).write_text("".join(line for line in lines if json.loads(line)["end"] <= KILLED_AT),
                                   encoding="utf-8")
    started = sum(1 for t in workload().tasks if t.arrival <= KILLED_AT)
    results.write_json(folder, results.PROGRESS_FILE, {"tasks_started": started})
    (folder / results.SUMMARY_FILE).unlink()
    results.write_json(folder, results.SUMMARY_FILE, rebuild(folder)[0].to_dict())
    return folder


def add_hostile_failures(folder: Path) -> None:
    """Failed attempts whose error class and message are markup, as a hostile or broken server may
    answer; the summary is rebuilt from the records with them."""
    from simulator.metrics.summary import rebuild

    failures = [CallRecord(task_id=HOSTILE_ID, task_class=HOSTILE_CLASS, call_index=9, attempt=k, intended_send=1.0,
                           actual_send=1.0, end=1.2 + k, ok=False, status=502, error_class="http_5xx<br>",
                           error_message=HOSTILE_MESSAGE) for k in range(2)]
    with open(folder / results.CALLS_FILE, "a", encoding="utf-8") as fh:
        for record in failures:
            fh.write(json.dumps(results.record_dict(record)) + "\n")
    (folder / results.SUMMARY_FILE).unlink()
    results.write_json(folder, results.SUMMARY_FILE, rebuild(folder)[0].to_dict())


def figure_at(data: object, path: list) -> object:
    """The value at a cell's data-source path (keys and list indices) in a JSON document."""
    for key in path:
        data = data[key]  # type: ignore[index]
    return data


def shown_number(text: str, value: float, scale: float) -> None:
    """Check a cell's text shows value × scale to the digits it prints: '1,234', '12.3 ms', '45.6%',
    '0.00389', '0.0000123'."""
    number = text.strip().removeprefix("≥ ").split(" ")[0].rstrip("%").replace(",", "")
    expected = value * scale
    decimals = len(number.split(".")[1]) if "." in number else 0
    assert abs(float(number) - expected) <= 0.5 * 10 ** -decimals + 1e-9 * abs(expected), (text, value, scale)


SCIENTIFIC = re.compile(r"\d[eE][-+]?\d")


def check_cells(cells: list[dict], documents: list[object]) -> int:
    """Every cell that says which figure it shows (data-source, data-folder, data-value, data-scale)
    holds exactly that figure of `documents[folder]` and shows it, never in scientific notation; returns
    how many were checked."""
    for cell in cells:
        assert not SCIENTIFIC.search(cell["text"]), cell
        path = json.loads(cell["source"])
        expected = figure_at(documents[int(cell["folder"])], path)
        assert json.loads(cell["value"]) == expected, (path, cell["value"], expected)
        shown_number(cell["text"], expected, float(cell["scale"]))
    return len(cells)


class Page(HTMLParser):
    """What the tests read from a page: its tags, its text, the cells that name their figure (each with
    the caption of its table, or 'key figures' for a headline tile, and its tone) and each table's rows
    of cell texts by caption."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.cells: list[dict] = []
        self.svg_text: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._open: list[dict] = []
        self._svg = 0
        self._where = ""
        self._caption: list[str] | None = None
        self._row: list[str] | None = None
        self._td: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        self._svg += tag == "svg"
        if tag == "div" and attributes.get("class") == "keys":
            self._where = "key figures"
        elif tag == "table":
            self._where = ""
        elif tag == "caption":
            self._caption = []
        elif tag == "tr" and self._where:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._td = []
        if "data-source" in attributes:
            tones = [c.removeprefix("tone-") for c in (attributes.get("class") or "").split() if c.startswith("tone-")]
            cell = {"source": attributes["data-source"], "folder": attributes["data-folder"],
                    "value": attributes["data-value"], "scale": attributes["data-scale"], "text": "",
                    "where": self._where, "tone": tones[0] if tones else ""}
            self.cells.append(cell)
            self._open.append(cell)
        elif self._open:
            self._open.append({})

    def handle_endtag(self, tag: str) -> None:
        self._svg -= tag == "svg"
        if self._open and tag in ("td", "span"):
            self._open.pop()
        if tag == "caption" and self._caption is not None:
            self._where = "".join(self._caption).strip()
            self.tables[self._where] = []
            self._caption = None
        elif tag in ("td", "th") and self._td is not None and self._row is not None:
            self._row.append("".join(self._td).strip())
            self._td = None
        elif tag == "tr" and self._row is not None:
            self.tables.setdefault(self._where, []).append(self._row)
            self._row = None
        elif tag == "table":
            self._where = ""

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._svg:
            self.svg_text.append(data)
        if self._open and self._open[-1]:
            self._open[-1]["text"] += data
        if self._caption is not None:
            self._caption.append(data)
        if self._td is not None:
            self._td.append(data)
