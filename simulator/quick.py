"""A scenario from command-line flags, without a file: the quick path of `agentload run` and `simulate`.

Users of `vllm bench serve`, GuideLLM and AIPerf start from one command line: a dataset, a rate, a
burstiness, a concurrency. `QuickSpec` holds those flags; `scenario_data` turns them into the mapping a
scenario file would hold and `build` validates it as `simulator.scenario.parse` validates a file (the
same checks and messages, each problem named by the flag it came from), so a quick run is an ordinary
`Scenario`. `saved_text` writes the scenario that ran as a YAML file to keep and rerun
(`--save-scenario`), its relative paths made right for the file's folder.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from .errors import InputError
from .redact import url_secrets
from .scenario import Scenario, parse

SOURCE = "command line"
"""What errors of a quick scenario name as their file (relative paths resolve against the current folder)."""

SLO_NAMES = ("ttft_ms", "tpot_ms", "task_s")


@dataclasses.dataclass
class QuickSpec:
    """The flags of a quick run (None: not given, the scenario's default applies)."""

    traces: Sequence[str] = ()
    """Trace files or folders (`--trace`), or none with `workload_model`."""
    workload_model: Optional[str] = None
    """Workload model YAML to generate from (`--workload-model`)."""
    format: Optional[str] = None
    on_error: Optional[str] = None
    assume_append_only: bool = False
    target: Optional[str] = None
    """Base URL of the server (None: the built-in emulator)."""
    served_model: Optional[str] = None
    api: Optional[str] = None
    vocab_size: Optional[int] = None
    emulator_profile: Optional[str] = None
    """The twin profile a simulation ran on (`simulate -p`): a saved scenario's emulator serves it."""
    rate: Optional[float] = None
    """Tasks per second: the trace's arrivals rescaled to it, or a model's rate."""
    rate_scale: Optional[float] = None
    burstiness: Optional[float] = None
    concurrency: Optional[int] = None
    duration: Optional[float] = None
    tasks: Optional[int] = None
    seed: Optional[int] = None
    warmup: Optional[float] = None
    slo: Sequence[str] = ()
    """'task_s.p90=60' and the like."""
    gap_cap: Optional[float] = None
    token_scale: Optional[float] = None
    context_cap: Optional[int] = None
    name: Optional[str] = None


class _Built:
    """A scenario mapping under construction, remembering which flag set each dotted key."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.flags: dict[str, str] = {}

    def put(self, path: str | tuple[str, ...], value: Any, flag: str) -> None:
        """Set the key at `path` (dotted, or its parts where a key has a dot: `p99.9`) unless `value` is None."""
        if value is None:
            return
        *parents, last = path.split(".") if isinstance(path, str) else path
        here = self.data
        for part in parents:
            here = here.setdefault(part, {})
        here[last] = value
        self.flags[".".join([*parents, last])] = flag

    def flag_of(self, path: Optional[str]) -> Optional[str]:
        """The flag behind a problem at the dotted `path`: the one that set the longest key it lies under,
        else those that set keys under it (a problem of a whole section, e.g. two rates at once)."""
        if not path:
            return None
        best = max((p for p in self.flags if path == p or path.startswith(p + ".")), key=len, default=None)
        if best is not None:
            return self.flags[best]
        under = sorted({flag for p, flag in self.flags.items() if p.startswith(path + ".")})
        return ", ".join(under) or None


def _built(spec: QuickSpec) -> _Built:
    """The scenario mapping of `spec`, each key remembering its flag; flags that make no sense together
    (or without their partner) are refused here, before any validation."""
    if bool(spec.traces) == (spec.workload_model is not None):
        raise InputError("give a workload: --trace PATH... or --workload-model MODEL.yaml (one of them)", file=SOURCE)
    if spec.target is None:
        for flag, value in (("--served-model", spec.served_model), ("--api", spec.api)):
            if value is not None:
                raise InputError(f"{flag} applies to a --target server (without --target, the built-in emulator "
                                 "serves the run)", file=SOURCE, field=flag)
    generated = spec.workload_model is not None
    if generated and spec.tasks is None and spec.duration is None:
        raise InputError("say how much to generate from the workload model: --tasks N or --duration S", file=SOURCE,
                         field="--workload-model")
    if generated and (spec.format is not None or spec.on_error is not None or spec.assume_append_only):
        raise InputError("--format, --on-error and --assume-append-only apply to --trace", file=SOURCE,
                         field="--format")

    b = _Built()
    first = spec.workload_model or spec.traces[0]
    b.put("name", spec.name or Path(first).stem or "quick", "--name")
    b.put("workload.trace", None if generated else (spec.traces[0] if len(spec.traces) == 1 else list(spec.traces)),
          "--trace")
    b.put("workload.model", spec.workload_model, "--workload-model")
    b.put("workload.format", spec.format, "--format")
    b.put("workload.on_error", spec.on_error, "--on-error")
    b.put("workload.assume_append_only", True if spec.assume_append_only else None, "--assume-append-only")
    where = "workload.generate" if generated else "workload.transforms"
    b.put(f"{where}.rate", spec.rate, "--rate")
    b.put(f"{where}.burstiness", spec.burstiness, "--burstiness")
    b.put("workload.transforms.rate_scale", spec.rate_scale, "--rate-scale")
    b.put("workload.transforms.gap_cap", spec.gap_cap, "--gap-cap")
    b.put("workload.transforms.token_scale", spec.token_scale, "--token-scale")
    b.put("workload.transforms.context_cap", spec.context_cap, "--context-cap")
    if spec.target is not None:
        b.put("target.base_url", spec.target, "--target")
        b.put("target.model", spec.served_model, "--served-model")
        b.put("target.api", spec.api, "--api")
        b.put("target.vocab_size", spec.vocab_size, "--vocab-size")
    else:
        b.put("emulator.vocab_size", spec.vocab_size, "--vocab-size")
        b.put("emulator.profile", spec.emulator_profile, "--profile")
    b.put("run.max_in_flight", spec.concurrency, "--concurrency")
    b.put("run.duration", spec.duration, "--duration")
    b.put("run.max_tasks", spec.tasks, "--tasks")
    b.put("run.seed", spec.seed, "--seed")
    b.put("run.warmup", spec.warmup, "--warmup")
    for item in spec.slo:
        name, percentile, value = _slo_item(item)
        b.put(("slo", name, percentile), value, f"--slo {name}.{percentile}")
    return b


def _slo_item(item: str) -> tuple[str, str, float]:
    """'task_s.p90=60' -> ('task_s', 'p90', 60.0); the percentile key is checked by the scenario's model."""
    key, sep, raw = item.partition("=")
    name, dot, percentile = key.strip().partition(".")
    if not sep or not dot or not percentile:
        raise InputError(f"expects TARGET.PERCENTILE=BOUND, e.g. task_s.p90=60, got {item!r}", file=SOURCE,
                         field="--slo")
    if name not in SLO_NAMES:
        raise InputError(f"unknown target {name!r} in {item!r} (targets: {', '.join(SLO_NAMES)})", file=SOURCE,
                         field="--slo")
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"the bound in {item!r} is not a number", file=SOURCE, field="--slo") from None
    return name, percentile, value


def scenario_data(spec: QuickSpec) -> dict[str, Any]:
    """The mapping a scenario file would hold for these flags (only what they set)."""
    return _built(spec).data


def build(spec: QuickSpec, overrides: Sequence[str] = ()) -> Scenario:
    """The scenario these flags describe, `--set KEY=VALUE` overrides applied, validated as a file is; a
    problem is named by the flag it came from (or as from --set)."""
    built = _built(spec)
    text = yaml.safe_dump(built.data, sort_keys=False)
    try:
        return parse(text, SOURCE, overrides)
    except InputError as exc:
        raise _by_flag(exc, built) from None


def _by_flag(exc: InputError, built: _Built) -> InputError:
    """`exc` with each problem pointed at its flag rather than at a line of the mapping the flags made."""
    problems = []
    for problem in getattr(exc, "problems", (exc,)):
        flag = None if "(from --set)" in problem.message else built.flag_of(problem.path)
        if flag is not None:
            problems.append(InputError(problem.message, file=SOURCE, field=flag))
        else:
            problems.append(InputError(problem.message, file=SOURCE, path=problem.path, field=problem.field))
    several = getattr(InputError, "several", None)
    return several(problems) if several is not None else problems[0]


# --- saving ------------------------------------------------------------------------------------------------


def saved_text(scenario: Scenario, path: str | Path, command: str, profile: Optional[str] = None) -> str:
    """The scenario that ran as YAML for the file `path`: what was set (by flags, a file, --set), relative
    paths made relative to the file's folder, and comments saying which `command` (the words after
    `agentload`) made it and how to run it again (`profile`: the twin a simulation ran on).
    A setting that may hold a secret (URL credentials, header values, an API key) is refused: a saved
    file keeps what it is given."""
    data = scenario.model_dump(mode="json", by_alias=True, exclude_unset=True)
    _refuse_secrets(data)
    folder = Path(path).resolve().parent
    base = scenario.base_dir()
    workload = data.get("workload", {})
    if "trace" in workload:
        traces = workload["trace"]
        moved = [_relative(base, p, folder) for p in ([traces] if isinstance(traces, str) else traces)]
        workload["trace"] = moved[0] if isinstance(traces, str) else moved
    if "model" in workload:
        workload["model"] = _relative(base, workload["model"], folder)
    profile = data.get("emulator", {}).get("profile")
    if profile is not None and Path(profile).suffix in (".yaml", ".yml"):
        data["emulator"]["profile"] = _relative(base, profile, folder)
    name = _shell_word(str(path))
    again = (f"agentload simulate {name} -p {_shell_word(profile)}" if profile is not None
             else f"agentload run {name}")
    header = (f"# Scenario written by: agentload {command}\n"
              f"# Run it again with:   {again}\n"
              "# (docs/scenario.md describes every key)\n")
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def save(scenario: Scenario, path: str | Path, command: str, profile: Optional[str] = None) -> None:
    """Write `saved_text` to `path`, making its folder (an unwritable path is bad input)."""
    text = saved_text(scenario, path, command, profile)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the scenario: {exc.strerror or exc}", file=str(path),
                         field="--save-scenario") from None


def _refuse_secrets(data: dict[str, Any]) -> None:
    target = data.get("target") or {}
    found = []
    if url_secrets(target.get("base_url", "")):
        found.append("credentials in the target URL")
    if target.get("headers"):
        found.append("target.headers (their values may be credentials)")
    if (data.get("emulator") or {}).get("api_key"):
        found.append("emulator.api_key")
    if found:
        raise InputError(f"a saved scenario would keep {' and '.join(found)}: give an API key through an environment "
                         "variable instead (--set target.api_key_env=NAME), or write the file by hand",
                         file=SOURCE, field="--save-scenario")


def _relative(base: Path, path: str, folder: Path) -> str:
    """`path` as seen from `folder`: relative to `base` before, relative to `folder` now; an absolute path
    (or one from the home folder) stays as it was given."""
    full = Path(os.path.expanduser(path))
    if full.is_absolute():
        return path
    full = base / full
    try:
        return Path(os.path.relpath(full.resolve(), folder)).as_posix()
    except ValueError:  # another drive (Windows): no relative path exists
        return str(full.resolve())


def _shell_word(text: str) -> str:
    import shlex

    return shlex.quote(text)
