"""docs/trace-task.schema.json must be what `simulator.traces.native.task_json_schema()` gives today.

When the schema classes change, regenerate the file with:
    .venv/bin/python tests/test_trace_schema.py --write
"""

import json
import sys
from pathlib import Path

from simulator.traces.native import task_json_schema

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "trace-task.schema.json"


def render() -> str:
    """The schema file's expected text."""
    return json.dumps(task_json_schema(), indent=2) + "\n"


def test_schema_file_is_current():
    assert SCHEMA_FILE.exists(), f"missing {SCHEMA_FILE}; run: python {Path(__file__).name} --write"
    assert SCHEMA_FILE.read_text() == render(), (
        f"{SCHEMA_FILE} is stale; regenerate it with: .venv/bin/python tests/test_trace_schema.py --write"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        SCHEMA_FILE.write_text(render())
        print(f"wrote {SCHEMA_FILE}")
    else:
        sys.exit("usage: test_trace_schema.py --write")
