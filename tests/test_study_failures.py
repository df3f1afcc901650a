"""Bad input to a study: a server command that does not exist, a server that never becomes healthy, one
that crashes mid-point, one that ignores SIGTERM; each a clear error naming the config and the point,
that point marked failed, the rest of the study run, nothing measured lost. Also: a restarted study
keeps its finished points, and bad study files are errors naming file, line and key."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from simulator.cli import main as cli_main
from simulator.errors import InputError
from simulator.live.vllm.server import ServerProcess
from simulator.metrics import results
from simulator.study import schema

BASE = """\
name: failures
workload:
  synthetic: {input_tokens: 32, output_tokens: 4, concurrency: 6, calls: 6}
  stagger: 0.05
slo:
  task_s: {p95: 5}
configs:
  base: {name: emu, emulator: {ttft: 0.01, itl: 0.002}}
  variants:
VARIANTS
load: {axis: rate, points: [10, 20]}
"""

# A stand-in server: healthy, lists a model, answers its first two completions (the run's check before
# the point, then the point's first call) with one streamed token, and dies (exit code 3) at the third.
CRASHING_SERVER = textwrap.dedent("""\
    import json, os, sys
    from aiohttp import web

    seen = 0

    async def health(request):
        return web.Response(text="ok")

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    async def complete(request):
        global seen
        body = await request.json()
        seen += 1
        if seen > 2:
            print("crashing at request", seen, flush=True)
            os._exit(3)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}}
        for event in (chunk, usage):
            await resp.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")
        await resp.write(b"data: [DONE]\\n\\n")
        return resp

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/v1/models", models),
                    web.post("/v1/completions", complete)])
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
""")


def write_study(tmp_path: Path, variants: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(BASE.replace("VARIANTS", textwrap.indent(variants, "    ")))
    return path


def run_study(path: Path, folder: Path) -> tuple[int, dict]:
    code = cli_main(["study", str(path), "-o", str(folder)])
    return code, json.loads((folder / "study.json").read_text())


def config(study: dict, name: str) -> dict:
    return next(c for c in study["configs"] if c["name"] == name)


def test_missing_command_and_never_healthy_fail_their_points_and_the_rest_goes_on(tmp_path, capsys):
    variants = f"""\
- name: missing
  server: {{argv: [{tmp_path / 'no-such-server'}, --port, "{{port}}"]}}
- name: sleepy
  server: {{argv: [{sys.executable}, -c, "import time; time.sleep(120)"], startup_timeout: 1, stop_timeout: 2}}
"""
    code, study = run_study(write_study(tmp_path, variants), tmp_path / "out")
    assert code == 1  # a study with failed points fails
    assert all(p["status"] == "ok" for p in config(study, "emu")["points"])  # the base ran in full
    missing = config(study, "missing")
    assert missing["status"] == "failed" and len(missing["points"]) == 2
    first = missing["points"][0]["error"]
    assert first.startswith("config missing, sweep point rate-10, repeat 0: server did not start")
    assert "no-such-server" in first and "No such file" in first
    # the second point does not wait again: it fails at once with the same reason
    assert "config missing, sweep point rate-20" in missing["points"][1]["error"]
    sleepy = config(study, "sleepy")
    assert "config sleepy, sweep point rate-10, repeat 0" in sleepy["points"][0]["error"]
    assert "not ready" in sleepy["points"][0]["error"] and "within 1s" in sleepy["points"][0]["error"]
    assert (tmp_path / "out" / sleepy["server"]["log"]).exists()
    assert len(study["failed_points"]) == 4
    out = capsys.readouterr()
    assert "FAILED: config missing, sweep point rate-10" in out.out


def test_server_crashing_mid_point_fails_that_point_keeps_its_records_and_is_restarted(tmp_path):
    script = tmp_path / "crash_server.py"
    script.write_text(CRASHING_SERVER)
    variants = f"""\
- name: crashy
  server: {{argv: [{sys.executable}, {script}, "{{port}}"], startup_timeout: 30}}
"""
    code, study = run_study(write_study(tmp_path, variants), tmp_path / "out")
    assert code == 1
    crashy = config(study, "crashy")
    first, second = crashy["points"]
    assert first["status"] == "failed"
    assert first["error"].startswith("config crashy, sweep point rate-10, repeat 0: the server exited with code 3 "
                                     "during the point")
    assert "crashing at request 3" in first["error"]  # its last log lines
    # what the point measured is kept: its records (the call answered before the crash among them),
    # its summary, and its figures in study.json
    folder = tmp_path / "out" / first["folder"]
    calls = results.read_calls(folder)
    assert sum(c.ok for c in calls) == 1 and sum(not c.ok for c in calls) >= 1
    assert (folder / "summary.json").exists() and first["tasks_completed"] == 1
    # the server was started again for the next point, which failed the same way
    assert crashy["server"]["starts"] == 2 and "rate-20" in second["error"]
    assert (tmp_path / "out" / "servers" / "crashy.2.log").exists()
    assert all(p["status"] == "ok" for p in config(study, "emu")["points"])


def test_a_server_that_ignores_sigterm_is_killed(tmp_path):
    server = ServerProcess([sys.executable, "-c",
                            "import signal, time\n"
                            "from http.server import HTTPServer, BaseHTTPRequestHandler\n"
                            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                            "class H(BaseHTTPRequestHandler):\n"
                            "    def do_GET(self):\n"
                            "        self.send_response(200); self.end_headers()\n"
                            "import sys\n"
                            "HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n", "{port}"],
                           log_path=tmp_path / "log.txt", startup_timeout_s=30)
    server.start()
    began = time.monotonic()
    code = server.stop(grace_s=0.5)
    assert code == -signal.SIGKILL and time.monotonic() - began < 10


def test_a_restarted_study_keeps_finished_points_and_sets_aside_an_interrupted_one(tmp_path):
    path = write_study(tmp_path, "[]")
    out = tmp_path / "out"
    code, first = run_study(path, out)
    assert code == 0 and first["complete"]
    points = config(first, "emu")["points"]
    cut = out / points[1]["folder"]
    (cut / "study-point.json").unlink()  # as if the study had been killed during this point
    before = (out / points[0]["folder"] / "calls.jsonl").read_text()
    code, second = run_study(path, out)
    assert code == 0
    again = config(second, "emu")["points"]
    assert (out / points[0]["folder"] / "calls.jsonl").read_text() == before  # kept, not run again
    assert second["overhead"]["points"] == 1  # only the cut point ran now
    assert (cut.parent / f"{cut.name}.interrupted-1" / "calls.jsonl").exists()  # nothing measured deleted
    assert again[1]["status"] == "ok" and (cut / "study-point.json").exists()
    # a changed study file does not resume into the folder of another definition
    path.write_text(path.read_text().replace("points: [10, 20]", "points: [10, 30]"))
    assert cli_main(["study", str(path), "-o", str(out)]) == 2


@pytest.mark.parametrize("text, where", [
    ("name: x\nworkload: {synthetic: {input_tokens: 1, output_tokens: 1, concurrency: 1}}\nconfigs:\n"
     "  base: {name: a, profile: tiny-vllm-cpu, colour: red}\nreference: {synthetic: {input_tokens: 1, "
     "output_tokens: 1, concurrency: 1}}\n", "s.yaml:4: at configs.base.colour: field 'colour': unknown key"),
    ("name: x\nworkload: {synthetic: {input_tokens: 1, output_tokens: 1, concurrency: 1}}\nconfigs:\n"
     "  base: {name: a, profile: tiny-vllm-cpu, url: 'http://x'}\nload: {axis: rate, points: [1]}\n",
     "s.yaml:4: at configs.base: field 'base': the base config needs exactly one of"),
    ("name: x\nworkload: {synthetic: {input_tokens: 1, output_tokens: 1, concurrency: 1}}\nconfigs:\n"
     "  base: {name: a, profile: tiny-vllm-cpu}\nload: {axis: rate, points: [1, -2]}\n",
     "s.yaml:5: at load: field 'load': points must be a non-empty list of values > 0"),
])
def test_bad_study_files_name_file_line_and_key(text, where):
    with pytest.raises(InputError) as err:
        schema.parse(text, "s.yaml")
    assert str(err.value).startswith(where)


def test_a_rate_axis_on_a_closed_loop_workload_is_refused(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nworkload: {synthetic: {input_tokens: 8, output_tokens: 2, concurrency: 2}}\n"
                    "configs:\n  base: {name: a, profile: tiny-vllm-cpu}\nload: {axis: rate, points: [1]}\n")
    assert cli_main(["study", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "s.yaml: at load.axis:" in err and "all arrive at once" in err
    assert not (tmp_path / "out").exists()  # refused before anything ran
