"""How `agentload --help` and every command's help read: one formatter for all of them (paragraphs
wrapped to the terminal, indented blocks kept as written, each option's default said), and the examples
of each command, appended to its epilog by `finish` once every command is registered."""

from __future__ import annotations

import argparse
import textwrap

OUTPUT_RULE = (
    "-o/--output names what a command writes: a result folder (DIR) for run, simulate, study and sweep; a "
    "file (FILE) for trace convert, transform, generate, fit, calibrate and record."
)

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "": [
        ("replay the quickstart scenario against the built-in emulator", "agentload run scenarios/quickstart.yaml"),
        ("a trace at 0.5 tasks/s against a server, without a scenario file",
         "agentload run --trace traces/claude-code --target http://localhost:8000 --rate 0.5 --slo task_s.p90=600"),
        ("predict the same on the server twin", "agentload simulate scenarios/quickstart.yaml -p tiny-vllm-cpu"),
        ("help on one command", "agentload run --help"),
    ],
    "run": [
        ("replay a scenario file against the server or emulator it names", "agentload run scenarios/quickstart.yaml"),
        ("the same, shorter, into a folder of your choice",
         "agentload run scenarios/quickstart.yaml -o results/try1 --set run.max_tasks=3"),
        ("no scenario file: a trace at 0.5 tasks/s, at most 8 tasks at once, against a vLLM server",
         "agentload run --trace traces/claude-code --target http://localhost:8000 --rate 0.5 --concurrency 8 "
         "--slo task_s.p90=600 --save-scenario mine.yaml"),
        ("vllm bench serve's names work too: bursty arrivals (gamma shape 0.5) on the built-in emulator",
         "agentload run --trace traces/claude-code --request-rate 1 --burstiness 0.5 --max-concurrency 4 "
         "--gap-cap 5 --tasks 5"),
        ("generate 50 tasks from a workload model and fail the job on a missed SLO",
         "agentload run --workload-model models/claude-code.yaml --tasks 50 --rate 0.2 --target http://localhost:8000 "
         "--slo ttft_ms.p99=2000 --fail-on-slo"),
    ],
    "simulate": [
        ("predict a scenario on the twin of a preset profile",
         "agentload simulate scenarios/quickstart.yaml -p tiny-vllm-cpu"),
        ("no scenario file: a trace at 2 tasks/s, bursty, judged against a task SLO",
         "agentload simulate --trace traces/claude-code --token-scale 0.04 --context-cap 4096 -p tiny-vllm-cpu "
         "--rate 2 --burstiness 0.5 --slo task_s.p90=120 --fail-on-slo"),
        ("list the preset profiles", "agentload profiles"),
    ],
    "profiles": [("list the twin's preset profiles", "agentload profiles")],
    "trace": [
        ("what a trace holds", "agentload trace inspect traces/claude-code"),
        ("convert it to the native JSONL", "agentload trace convert traces/mooncake -o mooncake.jsonl"),
    ],
    "trace inspect": [
        ("tables of a trace folder", "agentload trace inspect traces/claude-code"),
        ("the same as JSON, a format forced", "agentload trace inspect traces/mooncake --format mooncake --json"),
    ],
    "trace convert": [
        ("any supported trace(s) to one native JSONL file",
         "agentload trace convert traces/claude-code -o claude.jsonl"),
        ("skip bad records instead of stopping",
         "agentload trace convert traces/azure-2023 -o azure.jsonl --on-error skip"),
    ],
    "trace compare": [
        ("how close a generated workload is to the trace it was fitted to",
         "agentload trace compare traces/claude-code synthetic.jsonl"),
        ("as JSON", "agentload trace compare traces/claude-code synthetic.jsonl --json"),
    ],
    "fit": [
        ("fit a model to a trace folder", "agentload fit traces/claude-code -o my-model.yaml --allow-fallback"),
        ("one class for all tasks", "agentload fit traces/mooncake -o mooncake-model.yaml --one-class"),
    ],
    "generate": [
        ("500 tasks at 0.05 tasks/s, seeded", "agentload generate models/claude-code.yaml --tasks 500 --rate 0.05 "
         "--seed 1 -o synthetic.jsonl"),
        ("ten minutes of bursty arrivals (gamma shape 0.3)",
         "agentload generate models/claude-code.yaml --duration 600 --rate 0.1 --burstiness 0.3 -o bursty.jsonl"),
    ],
    "transform": [
        ("shrink prompts to a small context and cap tool time",
         "agentload transform synthetic.jsonl -o small.jsonl --token-scale 0.03 --context-cap 4096 --gap-cap 30"),
        ("arrivals at 2 tasks/s, re-spaced bursty", "agentload transform trace.jsonl -o bursty.jsonl --rate 2 "
         "--burstiness 0.5 --seed 1"),
    ],
    "report": [
        ("a run's summary again", "agentload report results/quickstart-20250101-120000"),
        ("two runs side by side, as an HTML page", "agentload report results/a results/b --html"),
        ("figures and tables as files", "agentload report results/a --png figures --csv tables"),
    ],
    "compare": [
        ("a live run and its simulation", "agentload compare results/live results/sim"),
        ("as JSON, first lines only", "agentload compare results/live results/sim --json | head -20"),
    ],
    "study": [
        ("run a study file", "agentload study studies/vllm-cpu.yaml"),
        ("only on the twin, fewer repeats, another folder",
         "agentload study studies/vllm-cpu.yaml --twin --set repeats=1 -o results/quick-study"),
    ],
    "sweep": [
        ("a server from one task at a time to saturation, 5 rates between, judged per task",
         "agentload sweep --trace traces/claude-code --target http://localhost:8000 --gap-cap 5 --slo task_s.p90=600"),
        ("the same on the twin of a profile, 8 rates", "agentload sweep scenarios/quickstart.yaml -p tiny-vllm-cpu "
         "--points 8"),
    ],
    "calibrate": [
        ("fit a profile to a running server",
         "agentload calibrate -p tiny-vllm-cpu --target http://localhost:8000 --vocab-size 1024 -o mine.yaml"),
        ("check that the fit recovers a profile from its own twin", "agentload calibrate -p tiny-vllm-cpu --twin"),
        ("fit a profile's power model to the NVML samples of live runs (target.gpu_metrics: true)",
         "agentload calibrate -p mine.yaml --power-from results/run-a results/run-b -o mine-power.yaml"),
    ],
    "record": [
        ("record what agents send to a vLLM server: point them at port 8100 instead of 8000",
         "agentload record --upstream http://localhost:8000 --listen 127.0.0.1:8100 -o traffic.jsonl"),
        ("look at the recording while it grows", "agentload trace inspect traffic.jsonl"),
        ("replay it against the server", "agentload run --trace traffic.jsonl --target http://localhost:8000"),
        ("group calls by the agent's own session header, new file every hour",
         "agentload record --upstream http://localhost:8000 -o rec/traffic.jsonl --session-header x-claude-code-session-id "
         "--rotate-time 3600"),
    ],
    "serve-emulator": [
        ("an emulator serving the twin of a profile", "agentload serve-emulator --profile tiny-vllm-cpu --port 8000"),
        ("fixed token times and 1% HTTP 500s", "agentload serve-emulator --ttft 0.05 --itl 0.01 --fault http_500:0.01"),
    ],
    "vllm": [
        ("build the tiny test model, then serve it", "agentload vllm tiny-model models/tiny"),
        ("", "agentload vllm serve --model models/tiny --port 8000"),
    ],
    "vllm tiny-model": [("build the tiny test model into a folder", "agentload vllm tiny-model models/tiny")],
    "vllm serve": [("serve a model folder on port 8000", "agentload vllm serve --model models/tiny --port 8000")],
}


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs wrapped paragraph by paragraph (blank lines between them), a paragraph
    with an indented line kept exactly as written (exit codes, examples); and each option's default
    said after its help, unless the help says it already or there is none to say."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(line.strip() for line in lines), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False))
        return "\n\n".join(out)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # an option's help: never split `--max-concurrency` or a path at its hyphen
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or default is None or default is False
                or default is argparse.SUPPRESS or default == []):
            return text
        return f"{text} (default: %(default)s)"


def examples_text(key: str) -> str:
    """The 'examples:' block of a command (`key`: its words after agentload, '' for agentload itself)."""
    lines = ["examples:"]
    for comment, command in EXAMPLES.get(key, []):
        if comment:
            lines += textwrap.wrap(comment, _WIDTH, initial_indent="  # ", subsequent_indent="  # ",
                                   break_on_hyphens=False)
        lines += _shell_lines(command)
    return "\n".join(lines)


_WIDTH = 78
"""Columns of an example's lines (80-column terminals)."""


def _shell_lines(command: str) -> list[str]:
    """`command` as lines of at most `_WIDTH` columns where it can be, broken before an option (which
    keeps its values), each line but the last ending in a backslash so that it still pastes into a shell."""
    units: list[str] = []
    for word in command.split(" "):
        if units and not word.startswith("-") and units[-1].startswith("-"):
            units[-1] += " " + word  # an option's value stays with it
        else:
            units.append(word)
    lines: list[str] = []
    line = "  " + units[0]
    for unit in units[1:]:
        if len(line) + 1 + len(unit) + 2 > _WIDTH and unit.startswith("-"):
            lines.append(line + " \\")
            line = "      " + unit
        else:
            line += " " + unit
    return lines + [line]


def finish(parser: argparse.ArgumentParser, key: str = "") -> None:
    """Give `parser` and every command under it the shared formatter and their examples."""
    parser.formatter_class = HelpFormatter
    if key in EXAMPLES:
        parser.epilog = f"{parser.epilog}\n\n{examples_text(key)}" if parser.epilog else examples_text(key)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                finish(sub, f"{key} {name}".strip())
