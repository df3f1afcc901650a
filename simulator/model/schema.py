"""The `WorkloadModel`: what `agentload fit` writes and `agentload generate` reads, as versioned YAML.

Layout (each part documented in docs/workload-model.md)::

    agentload_model: 1
    source: [...]                 # traces it was fitted on
    notes: [...]                  # fallbacks taken, things a reader should know
    classes:
      <task class>:
        share: 1.0                # fraction of generated tasks (shares sum to 1)
        arrivals: {use, processes, candidates, note}
        structure:
          calls_per_task, stops, position_buckets, cells, reuse, block_size, context_limit, subagents

Loading validates everything with pydantic; a bad value raises `InputError` naming the file and the
YAML path (``$.classes.default.structure.cells[3].gap.sigma``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import numpy as np
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import validation
from ..errors import InputError
from .arrivals import ArrivalFit
from .dists import SUM_TOLERANCE, Dist, FitReport, Prob

VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _sums_to_one(probs: dict[str, float]) -> dict[str, float]:
    total = sum(probs.values())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"probabilities must sum to 1 (they sum to {total:.6g})")
    return probs


ProbTable = Annotated[dict[str, Prob], AfterValidator(_sums_to_one)]
"""Label → probability, summing to 1."""


class StopReasons(_Strict):
    """A Markov chain over stop reasons: the first call's, then each call's given the previous one's."""

    first: ProbTable
    after: dict[str, ProbTable] = {}


class Cell(_Strict):
    """Per-call distributions for calls in one position bucket after one previous stop reason.

    `task_length` is the first calls-per-task count of the task's length class (None: any length);
    `from_call` is the position bucket's first call index (None: any position); `after_stop` is the
    previous call's stop reason ('start' for a task's first call, None: any). For the first call,
    `appended` is the whole first prompt. A call uses the most specific cell that exists."""

    task_length: Optional[Annotated[int, Field(ge=1)]] = None
    from_call: Optional[Annotated[int, Field(ge=0)]] = None
    after_stop: Optional[str] = None
    samples: Annotated[int, Field(ge=0)] = 0
    appended: Dist
    output: Dist
    gap: Dist
    fit: dict[str, list[FitReport]] = {}


class RewritePairs(_Strict):
    """The recorded partial reuses as pairs: the i-th rewrite kept `kept[i]` of the previous prompt's
    blocks and appended `appended[i]` tokens. The two are strongly related (a compaction keeps little
    and appends a whole new context, a trim keeps all but a block and appends a little: Spearman
    -0.59 in the Weka set); drawn apart, big appends land on whole prefixes and inflate the prompt tail.
    A draw picks one pair; given the two marginals, each value is then drawn from its marginal within
    that pair's rank (an empirical copula: the pairs say how the two go together, the marginals give
    the values, smoothly, and stay editable), else it is the recorded value itself."""

    kept: Annotated[list[Annotated[float, Field(ge=0.0, le=1.0)]], Field(min_length=1)]
    appended: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]

    @model_validator(mode="after")
    def _check(self) -> "RewritePairs":
        if len(self.kept) != len(self.appended):
            raise ValueError(f"kept has {len(self.kept)} values but appended has {len(self.appended)}")
        return self

    def sample(self, rng: np.random.Generator, n: int, kept: Optional[Dist] = None,
               appended: Optional[Dist] = None) -> tuple[np.ndarray, np.ndarray]:
        """`n` (kept fraction, appended tokens) draws, each from a pair drawn with replacement; through
        the marginals `kept` and `appended` where given (see the class)."""
        m = len(self.kept)
        idx = rng.integers(0, m, n)
        out = []
        for values, dist in ((self.kept, kept), (self.appended, appended)):
            values = np.asarray(values, dtype=float)
            if dist is None:
                out.append(values[idx])
                continue
            rank = np.empty(m)
            rank[np.argsort(values, kind="stable")] = np.arange(m)
            out.append(dist.quantile((rank[idx] + rng.random(n)) / m))
        return out[0], out[1]


class TaskStarts(_Strict):
    """The recorded tasks' first prompts with their numbers of calls (sorted by calls). A generated
    task of n calls takes the first prompt of one of the `neighbours` recorded tasks closest to n
    calls (with all those at the same distance as the `neighbours`-th closest): long sessions start
    small (Spearman -0.42 between calls per task and first prompt in the Weka set), and since they
    carry most of the calls, a first prompt drawn apart from the length makes later prompts far too
    large; a first-call cell per length class rarely has the samples to carry it."""

    calls: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]
    first_input: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]
    neighbours: Annotated[int, Field(ge=1)] = 5

    @model_validator(mode="after")
    def _check(self) -> "TaskStarts":
        if len(self.calls) != len(self.first_input):
            raise ValueError(f"calls has {len(self.calls)} values but first_input has {len(self.first_input)}")
        return self

    def sample(self, rng: np.random.Generator, ncalls: np.ndarray) -> np.ndarray:
        """A first prompt (tokens) per task of `ncalls[i]` calls, from a recorded task near that length."""
        calls = np.asarray(self.calls)
        first = np.asarray(self.first_input, dtype=float)
        out = np.zeros(len(ncalls))
        k = min(self.neighbours, len(calls))
        for n in np.unique(ncalls).tolist():
            rows = np.flatnonzero(ncalls == n)
            dist = np.abs(calls - n)
            near = np.flatnonzero(dist <= np.partition(dist, k - 1)[k - 1])
            out[rows] = first[near[rng.integers(0, len(near), len(rows))]]
        return out


class StopReuse(_Strict):
    """Prefix reuse after one previous stop reason: its own chance of keeping the whole previous
    prompt, and its own partial-reuse distributions where it had the samples (None: the pooled ones)."""

    full_prob: Prob
    partial_fraction: Optional[Dist] = None
    partial_appended: Optional[Dist] = None
    partial_pairs: Optional[RewritePairs] = None


class Reuse(_Strict):
    """How much of the previous prompt the next one keeps as its prefix (in hash blocks)."""

    full_prob: Prob
    """Probability that the whole previous prompt is kept (the usual agent turn)."""
    partial_fraction: Optional[Dist] = None
    """Otherwise, the fraction of the previous prompt's blocks kept (context compaction, edits)."""
    partial_appended: Optional[Dist] = None
    """Tokens appended after a partial reuse."""
    partial_pairs: Optional[RewritePairs] = None
    """The recorded (kept fraction, appended tokens) pairs; when present, a partial reuse draws one
    pair instead of the two marginals above (which then only describe it: delete this to use them)."""
    after_stop: dict[str, StopReuse] = {}
    """Overrides by the previous call's stop reason (a new user turn after `end_turn` rewrites the
    prompt about three times as often as a turn after a tool call); other calls use the pooled values."""

    @model_validator(mode="after")
    def _check(self) -> "Reuse":
        pooled = self.partial_pairs is not None or (self.partial_fraction is not None and self.partial_appended is not None)
        if self.full_prob < 1.0 and not pooled:
            raise ValueError("full_prob < 1 needs partial_pairs, or partial_fraction and partial_appended")
        for label, row in self.after_stop.items():
            own = row.partial_pairs is not None or (
                (row.partial_fraction or self.partial_fraction) is not None
                and (row.partial_appended or self.partial_appended) is not None)
            if row.full_prob < 1.0 and not (own or pooled):
                raise ValueError(f"after_stop.{label}: full_prob < 1 needs partial_pairs, or partial_fraction and partial_appended")
        return self


class SubAgents(_Strict):
    """Sub-agents: after each call, a group starts with `spawn_prob`; `fan_out` of them, each with
    `structure`."""

    spawn_prob: Prob
    fan_out: Dist
    wait_prob: Prob = 1.0
    """Probability that the parent waits for a sub-agent before its next call."""
    structure: "Structure"


class Structure(_Strict):
    """What happens inside a task."""

    calls_per_task: Dist
    stops: StopReasons
    position_buckets: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    length_buckets: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] = [1]
    cells: Annotated[list[Cell], Field(min_length=1)]
    reuse: Reuse
    block_size: Annotated[int, Field(gt=0)] = 64
    context_limit: Annotated[int, Field(gt=0)]
    """Largest prompt; a turn that would pass it compacts (a partial reuse) instead."""
    peak_growth: dict[Annotated[int, Field(ge=0)], Dist] = {}
    """Optional cap: a task's largest prompt as a multiple of its first (>= 1), drawn once per task, by
    length class (key: the class's first calls-per-task count; key 0: all tasks, for classes without
    their own). A turn that would pass it compacts instead. `fit` no longer writes it (drawn apart from
    the appends, it flattened prompts that should grow: see docs/workload-model.md); older files keep it."""
    starts: Optional[TaskStarts] = None
    """When present, a task's first prompt comes from here, conditioned on its number of calls,
    instead of from the first-call cell's `appended` (which then only describes it)."""
    subagents: Optional[SubAgents] = None

    @model_validator(mode="after")
    def _check(self) -> "Structure":
        b = self.position_buckets
        if b[0] != 0 or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError("position_buckets must start at 0 and increase")
        lb = self.length_buckets
        if lb[0] != 1 or any(y <= x for x, y in zip(lb, lb[1:])):
            raise ValueError("length_buckets must start at 1 and increase")
        for i, cell in enumerate(self.cells):
            if cell.from_call is not None and cell.from_call not in b:
                raise ValueError(f"cells[{i}].from_call {cell.from_call} is not a bucket start")
            if cell.task_length is not None and cell.task_length not in lb:
                raise ValueError(f"cells[{i}].task_length {cell.task_length} is not a length bucket start")
        return self


class TaskClass(_Strict):
    """One task class: its share of tasks, its arrivals and its structure."""

    share: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    arrivals: ArrivalFit
    structure: Structure


class WorkloadModel(_Strict):
    """A fitted workload model, editable by hand."""

    agentload_model: Literal[1] = VERSION
    source: list[str] = []
    notes: list[str] = []
    classes: Annotated[dict[str, TaskClass], Field(min_length=1)]

    @model_validator(mode="after")
    def _shares(self) -> "WorkloadModel":
        total = sum(c.share for c in self.classes.values())
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise ValueError(f"class shares must sum to 1 (they sum to {total:.6g})")
        return self


SubAgents.model_rebuild()


def _yaml_path(loc: tuple) -> tuple[str, str]:
    """('$.a.b[2].c', 'c') from a pydantic error location."""
    parts = [p for p in loc if not (isinstance(p, str) and p.startswith("function-"))]
    path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    field = next((str(p) for p in reversed(parts) if isinstance(p, str)), "")
    return path, field


def _clean_loc(loc: tuple, data) -> tuple:
    """Drop the discriminator tags pydantic puts in a location (`…gap.lognormal.sigma` → `…gap.sigma`)."""
    out = []
    node = data
    for p in loc:
        if isinstance(node, dict) and isinstance(p, str) and p not in node and node.get("kind") == p:
            continue
        out.append(p)
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            node = None
    return tuple(out)


def validate_model(data, file: str = "<model>") -> WorkloadModel:
    """A `WorkloadModel` from parsed YAML; `InputError` naming the YAML path of every problem."""
    if not isinstance(data, dict):
        raise InputError("a model file must be a YAML mapping", file=file)
    if data.get("agentload_model") != VERSION:
        raise InputError(
            f"not a workload model of version {VERSION} (found {data.get('agentload_model')!r})",
            file=file, path="$.agentload_model", field="agentload_model",
        )
    try:
        return WorkloadModel.model_validate(data)
    except ValidationError as exc:
        # every problem at once, with the key or choice a misspelt one was likely meant as
        problems = []
        for problem in validation.problems(exc, WorkloadModel):
            path, field = _yaml_path(_clean_loc(problem.loc, data))
            problems.append(InputError(problem.text(), file=file, path=path, field=field or None))
        raise InputError.several(problems or [InputError(str(exc), file=file)]) from None


def load_model(path: str | Path) -> WorkloadModel:
    """Read and validate a model file."""
    name = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise InputError("no such model file", file=name) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"not YAML: {getattr(exc, 'problem', exc)}", file=name, line=mark.line + 1 if mark else None) from None
    return validate_model(data, name)


def dump_model(model: WorkloadModel) -> str:
    """The model as YAML text (keys in schema order, defaults kept so a reader sees every knob)."""
    data = model.model_dump(mode="json", exclude_none=True)
    return "# agentload workload model: edit freely, `agentload generate` validates it.\n" + yaml.safe_dump(
        data, sort_keys=False, width=120, default_flow_style=None
    )


def save_model(model: WorkloadModel, path: str | Path) -> None:
    """Write a model file."""
    Path(path).write_text(dump_model(model), encoding="utf-8")
