"""The help of every command (description, examples, defaults, -o), and a closed output pipe."""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import build_parser
from simulator.cli._help import EXAMPLES, HelpFormatter

ROOT = Path(__file__).resolve().parents[1]


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command words, parser) of agentload and of every command and sub-command under it."""
    found = []

    def walk(key: str, parser: argparse.ArgumentParser) -> None:
        found.append((key, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{key} {name}".strip(), sub)

    walk("", build_parser())
    return found


def test_every_command_has_a_description_examples_and_its_defaults_said():
    parsers = all_parsers()
    names = {key for key, _ in parsers}
    assert {"run", "simulate", "fit", "generate", "transform", "trace inspect", "trace convert", "trace compare",
            "vllm serve", "vllm tiny-model", "profiles", "study"} <= names
    for key, parser in parsers:
        assert parser.description and len(parser.description) > 40, key
        assert parser.epilog and "examples:\n" in parser.epilog, key
        assert parser.formatter_class is HelpFormatter, key
        formatter = HelpFormatter(parser.prog)
        for action in parser._actions:
            if action.option_strings:
                assert action.help, (key, action.option_strings)
            meaningful = action.default not in (None, False, [], argparse.SUPPRESS)
            if action.option_strings and meaningful and action.help is not argparse.SUPPRESS:
                assert "default" in formatter._get_help_string(action), (key, action.option_strings)


def test_every_example_parses_and_every_help_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for key, examples in EXAMPLES.items():
        commands = [shlex.split(command.split(" | ")[0]) for _, command in examples]
        assert any(words[1:1 + len(key.split())] == key.split() for words in commands), key
        for words in commands:
            assert words[0] == "agentload", words
            if "--help" not in words:
                build_parser().parse_args(words[1:])  # an unknown option or a missing argument exits
    for key, parser in all_parsers():
        text = parser.format_help()
        wide = [line for line in text.splitlines() if len(line) > 80]
        assert not wide, (key, wide)


def test_help_names_the_profiles_command_and_output_is_a_dir_or_a_file():
    parsers = dict(all_parsers())
    simulate = parsers["simulate"].format_help()
    assert "--list-profiles" not in simulate and "agentload profiles" in simulate
    kinds = {}
    for key, parser in parsers.items():
        for action in parser._actions:
            if "-o" in action.option_strings:
                assert action.option_strings == ["-o", "--output"], key
                assert action.metavar in ("DIR", "FILE"), (key, action.metavar)
                kinds[key] = action.metavar
    assert kinds == {"run": "DIR", "simulate": "DIR", "study": "DIR", "sweep": "DIR", "trace convert": "FILE",
                     "transform": "FILE",
                     "generate": "FILE", "fit": "FILE", "calibrate": "FILE", "record": "FILE"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).parent))
    import report_folders

    tmp = tmp_path_factory.mktemp("pipe")
    return report_folders.simulation(tmp, "a"), report_folders.simulation(tmp, "b", 1)


def test_a_closed_pipe_ends_the_command_quietly(folders):
    """`agentload compare --json A B | head -1`, made certain: a pipe of one page (the JSON is several),
    so the command is still writing when head has read its line and gone."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    a, b = folders
    command = subprocess.Popen([sys.executable, "-m", "simulator", "compare", "--json", str(a), str(b)],
                               stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT)
    head = subprocess.Popen(["head", "-1"], stdin=read_end, stdout=subprocess.PIPE)
    os.close(read_end)
    os.close(write_end)
    first, _ = head.communicate(timeout=120)
    _, err = command.communicate(timeout=120)
    assert first.decode().strip() == "{"
    assert command.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err and b"Exception ignored" not in err, err.decode()



def test_a_python_that_is_not_there_is_a_clear_error(tmp_path, capsys):
    from simulator.cli import main

    assert main(["vllm", "tiny-model", str(tmp_path / "model"), "--python", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert f"could not be built: {tmp_path / 'nothing'}: No such file or directory" in err and "Traceback" not in err
