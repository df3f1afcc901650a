"""OpenTelemetry GenAI spans, as OTLP JSON (one export per file, or JSON Lines of exports as the collector's
file exporter writes them) or OTLP protobuf (one binary export request, or the collector's length-prefixed
stream of them: `simulator.traces.otlp_proto`).

Spans are read by the GenAI semantic conventions: ``gen_ai.operation.name`` tells LLM calls (``chat``,
``text_completion``, ``generate_content``), agents (``invoke_agent``) and tools (``execute_tool``, whose
time ends up in the gaps); ``gen_ai.usage.input_tokens`` / ``output_tokens`` give the sizes (the older
``prompt_tokens`` / ``completion_tokens`` are accepted), ``gen_ai.response.model`` (else
``gen_ai.request.model``) the model, ``gen_ai.response.finish_reasons`` the stop reason and
``gen_ai.agent.name`` the task class. Beside them, OpenInference's conventions (Arize Phoenix):
``openinference.span.kind`` ``LLM``, ``AGENT`` and ``TOOL`` play the three operations,
``llm.token_count.prompt`` / ``completion`` give the sizes, ``llm.model_name`` the model,
``llm.finish_reason`` the stop reason and ``agent.name`` the task class. A span with both conventions is
read by the GenAI ones. Older OpenLLMetry releases name no operation: their ``llm.request.type``
(``chat``, ``completion``) marks LLM calls, and ``gen_ai.completion.0.finish_reason`` gives the stop
reason. Spans of none of these kinds only link the tree.

Prefix hash ids come from the messages an LLM span carries (`simulator.traces.content`), in this order of
preference: ``gen_ai.input.messages`` (JSON, after ``gen_ai.system_instructions`` when present), the older
indexed ``gen_ai.prompt.N.*`` attributes (OpenLLMetry), OpenInference's ``llm.input_messages.N.*``, else
OpenInference's ``input.value`` when it is a JSON request with ``messages``. Spans without content get no
ids (``--assume-append-only`` can derive them from the token counts: `simulator.traces.structure`).

Tasks. Every agent span with no agent above it is a task; the LLM calls of an agent are the LLM spans whose
nearest agent ancestor it is, in start order. Agent spans nested under an agent (directly or through tool
spans) are its sub-tasks: ``after_call`` is the index of the parent's last call that ended before the
sub-agent started (-1 if none) and ``wait`` says whether the parent's next call started after the sub-agent
ended (with no next call: whether the parent agent's span outlived it). LLM spans of a trace that sit under
no agent form one more task for that trace, starting at its first call.

Timing. ``server_time`` is the LLM span's duration. A call's ``gap`` runs from the previous call's end, or
from the end of the sub-agents the parent waited for after that call when they ended later (agentload
replays a waited fork before the gap), to the call's start; the first call's gap runs from the agent's
start, or for a sub-agent from its spawn point (the end of the parent's ``after_call`` call), so the delay
before a sub-agent starts is kept. Overlapping calls inside one agent get gap 0 (counted in the notes).
``sent_at`` is the call's start from its agent's start; ``arrival`` is a task's start from the earliest
task start in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import HashIds, common_prefix
from ..workload import DEFAULT_CLASS, MAX_SECONDS, MAX_TOKENS, Call, Provenance, SubTask, Task, Workload
from . import otlp_proto
from .content import ContentHasher

FORMAT = "otel"
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
AGENT_OPERATION = "invoke_agent"
OPERATION = "gen_ai.operation.name"
SPAN_KIND = "openinference.span.kind"
OPENINFERENCE_OPERATIONS = {"LLM": "chat", "AGENT": AGENT_OPERATION, "TOOL": "execute_tool"}
"""OpenInference span kinds read as the GenAI operation of the same role."""
REQUEST_TYPE = "llm.request.type"
REQUEST_TYPE_OPERATIONS = {"chat": "chat", "completion": "text_completion"}
"""Older OpenLLMetry request types read as GenAI operations."""
_STOP_KEYS = ("gen_ai.response.finish_reasons", "llm.finish_reason", "gen_ai.completion.0.finish_reason")
_INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
_OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
_MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name")
_AGENT_NAME_KEYS = ("gen_ai.agent.name", "agent.name")
_NS = 1e9
_MAX_NANOS = (1 << 64) - 1
MAX_DEPTH = 64
"""Deepest nesting of agent spans read (an agent under an agent under ...); deeper is bad input."""


def _is_json(head: bytes) -> bool:
    return head.lstrip().startswith(b"{") and b'"resourceSpans"' in head


def sniff(path: Path, head: bytes) -> bool:
    """True for OTLP JSON (an object whose spans sit under ``resourceSpans``) and OTLP protobuf."""
    return _is_json(head) or otlp_proto.sniff(path, head)


def _is_protobuf(path: Path, head: bytes) -> bool:
    """Whether to read a file as protobuf: it looks like one, or at least starts like one and not like JSON
    (so a cut-off protobuf file read with ``--format otel`` is reported as such)."""
    return not _is_json(head) and (otlp_proto.sniff(path, head) or head[:1] in (b"\x0a", b"\x00"))


@dataclass
class _Span:
    trace: str
    id: str
    parent: str
    start: int
    end: int
    operation: Optional[str]
    attrs: dict[str, Any]
    where: tuple[Optional[int], str]  # (line, JSON path) for error messages
    calls: list[_Span] = field(default_factory=list)  # agents only: own LLM calls
    agents: list[_Span] = field(default_factory=list)  # agents only: nested agents
    hash_ids: tuple[int, ...] = ()  # LLM calls only: ids from the messages
    bad: bool = False  # LLM calls only: content unreadable (already reported)


class _Reader:
    """Turns OTLP exports into spans, reporting bad ones through the error policy."""

    def __init__(self, name: str, policy: ErrorPolicy) -> None:
        self.name = name
        self.policy = policy
        self.spans: list[_Span] = []

    def error(self, message: str, line: Optional[int], path: str, fld: Optional[str] = None) -> InputError:
        return InputError(message, file=self.name, line=line, path=path, field=fld)

    def export(self, obj: Any, line: Optional[int], root: str = "$") -> None:
        if not isinstance(obj, dict) or not isinstance(obj.get("resourceSpans"), list):
            self.policy.bad(self.error("expected an OTLP export with a resourceSpans list", line, root, "resourceSpans"))
            return
        for i, resource in enumerate(obj["resourceSpans"]):
            scopes = resource.get("scopeSpans", resource.get("instrumentationLibrarySpans", [])) \
                if isinstance(resource, dict) else None
            if not isinstance(scopes, list):
                self.policy.bad(self.error("expected a scopeSpans list", line, f"{root}.resourceSpans[{i}]", "scopeSpans"))
                continue
            for j, scope in enumerate(scopes):
                spans = scope.get("spans", []) if isinstance(scope, dict) else None
                base = f"{root}.resourceSpans[{i}].scopeSpans[{j}]"
                if not isinstance(spans, list):
                    self.policy.bad(self.error("expected a spans list", line, base, "spans"))
                    continue
                for k, raw in enumerate(spans):
                    try:
                        self.spans.append(self.span(raw, line, f"{base}.spans[{k}]"))
                    except InputError as exc:
                        self.policy.bad(exc)

    def span(self, raw: Any, line: Optional[int], path: str) -> _Span:
        if not isinstance(raw, dict):
            raise self.error("expected a span object", line, path)
        ids = []
        for key in ("traceId", "spanId"):
            value = raw.get(key)
            if not isinstance(value, str) or not value:
                raise self.error("missing or empty id", line, f"{path}.{key}", key)
            ids.append(value)
        parent = raw.get("parentSpanId") or ""
        if not isinstance(parent, str):
            raise self.error("expected a hex string", line, f"{path}.parentSpanId", "parentSpanId")
        start = self.nanos(raw, "startTimeUnixNano", line, path)
        end = self.nanos(raw, "endTimeUnixNano", line, path)
        if end < start:
            raise self.error("span ends before it starts", line, f"{path}.endTimeUnixNano", "endTimeUnixNano")
        if end - start > MAX_SECONDS * _NS:
            raise self.error(f"span lasts more than {MAX_SECONDS:g} s", line, f"{path}.endTimeUnixNano", "endTimeUnixNano")
        attrs = self.attributes(raw.get("attributes", []), line, path)
        operation = attrs.get(OPERATION)
        if not isinstance(operation, str):
            kind, request_type = attrs.get(SPAN_KIND), attrs.get(REQUEST_TYPE)
            if isinstance(kind, str):
                operation = OPENINFERENCE_OPERATIONS.get(kind.upper())
            elif isinstance(request_type, str):
                operation = REQUEST_TYPE_OPERATIONS.get(request_type)
            else:
                operation = None
        return _Span(ids[0], ids[1], parent, start, end, operation, attrs, (line, path))

    def nanos(self, raw: dict, key: str, line: Optional[int], path: str) -> int:
        value = raw.get(key)
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
            value = int(value)  # OTLP JSON writes 64-bit integers as strings
        if type(value) is int and 0 <= value <= _MAX_NANOS:
            return value
        raise self.error("expected unsigned 64-bit nanoseconds", line, f"{path}.{key}", key)

    def attributes(self, items: Any, line: Optional[int], path: str) -> dict[str, Any]:
        if not isinstance(items, list):
            raise self.error("expected a list of key/value pairs", line, f"{path}.attributes", "attributes")
        out: dict[str, Any] = {}
        for n, item in enumerate(items):
            where = f"{path}.attributes[{n}]"
            if not isinstance(item, dict) or not isinstance(item.get("key"), str):
                raise self.error("expected {key, value}", line, where, "key")
            try:
                out[item["key"]] = _value(item.get("value") or {})
            except (TypeError, ValueError, KeyError, AttributeError):
                raise self.error("bad attribute value", line, f"{where}.value", item["key"]) from None
        return out


def _value(node: dict) -> Any:
    """The Python value of an OTLP AnyValue."""
    if not isinstance(node, dict):
        raise TypeError(node)
    if "stringValue" in node:
        return str(node["stringValue"])
    if "intValue" in node:
        return int(node["intValue"])
    if "doubleValue" in node:
        return float(node["doubleValue"])
    if "boolValue" in node:
        return bool(node["boolValue"])
    if "arrayValue" in node:
        return [_value(v) for v in (node["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in node:
        return {kv["key"]: _value(kv.get("value") or {}) for kv in (node["kvlistValue"] or {}).get("values", [])}
    return None


def _exports(path: Path, name: str, policy: ErrorPolicy) -> Iterator[tuple[Optional[int], Any]]:
    """(line or None, export object): the whole file as one export, else one export per line."""
    data = path.read_bytes()
    if not data.strip():
        raise InputError("empty file", file=name)
    try:
        yield None, orjson.loads(data)
        return
    except orjson.JSONDecodeError as whole:
        lines = data.splitlines()
        filled = [n for n, raw in enumerate(lines) if raw.strip()]
        if len(filled) < 2 or not _parses(lines[filled[0]]):
            raise InputError(f"not JSON: {whole.msg} (column {whole.colno})", file=name, line=whole.lineno) from None
    for n in filled:
        try:
            obj = orjson.loads(lines[n])
        except orjson.JSONDecodeError:
            policy.bad(InputError("not JSON (truncated or malformed line)", file=name, line=n + 1))
            continue
        yield n + 1, obj


def _parses(raw: bytes) -> bool:
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return True


class _Builder:
    """Builds tasks from the span trees of one file."""

    def __init__(self, name: str, policy: ErrorPolicy, block_size: int = 0) -> None:
        self.name = name
        self.policy = policy
        self.block_size = block_size
        self.overlaps = 0
        self.orphans = 0
        self.empty_agents = 0

    def tasks(self, spans: list[_Span]) -> list[tuple[int, Task]]:
        """(start ns, task) for every task of the file."""
        by_trace: dict[str, dict[str, _Span]] = {}
        for span in spans:
            by_trace.setdefault(span.trace, {})[span.id] = span
        out: list[tuple[int, Task]] = []
        for trace, members in by_trace.items():
            owners = self.owners(members)
            roots: list[_Span] = []
            loose: list[_Span] = []
            for span in members.values():
                owner = owners[span.id]
                if span.operation == AGENT_OPERATION:
                    (owner.agents if owner else roots).append(span)
                elif span.operation in LLM_OPERATIONS:
                    (owner.calls if owner else loose).append(span)
            for root in sorted(roots, key=lambda s: (s.start, s.id)):
                try:
                    task = self.agent_task(root, f"otel-{trace[:8]}-{root.id}", root.start)
                except InputError as exc:
                    self.policy.bad(exc)
                    continue
                if task is not None:
                    out.append((root.start, task))
            calls = self.calls(loose)
            if calls:
                first = min(c.start for c in loose)
                out.append((first, self.task(f"otel-{trace[:8]}", DEFAULT_CLASS, calls, [], first, first, None)))
        return out

    def owners(self, members: dict[str, _Span]) -> dict[str, Optional[_Span]]:
        """Each span's nearest agent ancestor (None: none), memoised along the parent chains."""
        owner: dict[str, Optional[_Span]] = {}
        for span in members.values():
            chain = []
            node = span
            found: Optional[_Span] = None
            while True:
                parent_id = node.parent
                if not parent_id:
                    break
                if parent_id in owner:
                    parent = members[parent_id]
                    found = parent if parent.operation == AGENT_OPERATION else owner[parent_id]
                    break
                parent = members.get(parent_id)
                if parent is None:
                    self.orphans += node is span
                    break
                if parent.operation == AGENT_OPERATION:
                    found = parent
                    break
                if len(chain) > len(members):  # a parent cycle: stop rather than loop
                    break
                chain.append(parent)
                node = parent
            owner[span.id] = found
            for link in chain:
                owner[link.id] = found
        return owner

    def calls(self, spans: list[_Span]) -> list[tuple[_Span, Call]]:
        """LLM spans with their token counts, in start order; bad ones go to the error policy."""
        out = []
        for span in sorted(spans, key=lambda s: (s.start, s.end, s.id)):
            if span.bad:
                continue
            try:
                n_in = self.tokens(span, _INPUT_KEYS)
                n_out = self.tokens(span, _OUTPUT_KEYS)
            except InputError as exc:
                self.policy.bad(exc)
                continue
            attrs = span.attrs
            reasons = _first(attrs, _STOP_KEYS)
            if isinstance(reasons, str):
                reasons = [reasons]
            model = _first(attrs, _MODEL_KEYS)
            call = Call(n_in, n_out, hash_ids=span.hash_ids, block_size=self.block_size if span.hash_ids else 0,
                        server_time=(span.end - span.start) / _NS,
                        stop_reason=str(reasons[0]) if reasons else None,
                        model=str(model) if model else None)
            out.append((span, call))
        return out

    def tokens(self, span: _Span, keys: tuple[str, ...]) -> int:
        for key in keys:
            if key in span.attrs:
                value = span.attrs[key]
                if type(value) is not int or not 0 <= value <= MAX_TOKENS:
                    line, path = span.where
                    raise InputError(f"expected a whole token count from 0 to {MAX_TOKENS:,}", file=self.name,
                                     line=line, path=f"{path}.attributes", field=key)
                return value
        line, path = span.where
        named = keys[-1] if SPAN_KIND in span.attrs and OPERATION not in span.attrs else keys[0]
        raise InputError("LLM span without a token count", file=self.name, line=line, path=f"{path}.attributes",
                         field=named)

    def agent_task(self, agent: _Span, task_id: str, spawn: int, depth: int = 0) -> Optional[Task]:
        """The task of one agent span, its nested agents as sub-tasks; None when it holds no LLM call."""
        if depth > MAX_DEPTH:
            line, path = agent.where
            raise InputError(f"agent spans nested more than {MAX_DEPTH} deep", file=self.name, line=line, path=path,
                             field="parentSpanId")
        calls = self.calls(agent.calls)
        ends = [span.end for span, _ in calls]
        subs: list[tuple[int, bool, _Span, Task]] = []
        for sub in sorted(agent.agents, key=lambda s: (s.start, s.id)):
            after = max((i for i, end in enumerate(ends) if end <= sub.start), default=-1)
            if after + 1 < len(calls):
                wait = calls[after + 1][0].start >= sub.end
            else:
                wait = agent.end >= sub.end
            sub_spawn = ends[after] if after >= 0 else agent.start
            task = self.agent_task(sub, f"{task_id}/{sub.id}", sub_spawn, depth + 1)
            if task is not None:
                subs.append((after, wait, sub, task))
        if not calls and not subs:
            self.empty_agents += 1
            return None
        name = _first(agent.attrs, _AGENT_NAME_KEYS)
        return self.task(task_id, str(name) if name else DEFAULT_CLASS, calls, subs, spawn, agent.start, agent)

    def task(self, task_id, task_class, calls, subs, spawn, start, agent) -> Task:
        waited: dict[int, int] = {}
        for after, wait, sub, _ in subs:
            if wait:
                waited[after] = max(waited.get(after, 0), sub.end)
        out = []
        previous = spawn
        ids: HashIds = HashIds.run(0, 0)
        for index, (span, call) in enumerate(calls):
            ready = max(previous, waited.get(index - 1, 0))
            gap = span.start - ready
            if gap < 0:
                self.overlaps += 1
                gap = 0
            if gap > MAX_SECONDS * _NS or abs(span.start - start) > MAX_SECONDS * _NS:
                line, path = span.where
                raise InputError(f"starts more than {MAX_SECONDS:g} s from its agent or previous call", file=self.name,
                                 line=line, path=path, field="startTimeUnixNano")
            if call.hash_ids:  # the calls of an agent share their ids' storage (simulator.hash_ids)
                shared = common_prefix(ids, call.hash_ids)
                ids = ids.extend(shared, call.hash_ids[shared:])
                call = Call(call.input_tokens, call.output_tokens, call.gap, ids, call.block_size, call.server_time,
                            call.sent_at, call.stop_reason, call.model, call.messages)
            out.append(_with_times(call, gap / _NS, (span.start - start) / _NS))
            previous = span.end
        subtasks = tuple(SubTask(after, task, wait) for after, wait, _, task in subs)
        return Task(task_id, tuple(out), 0.0, task_class, subtasks)


def _first(attrs: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The first non-empty value among `keys`."""
    for key in keys:
        value = attrs.get(key)
        if value:
            return value
    return None


def _json_attribute(value: Any, span: _Span, key: str, name: str) -> Any:
    """An attribute that holds JSON text (or, from some exporters, the structure itself), decoded."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        line, path = span.where
        raise InputError(f"not JSON: {exc}", file=name, line=line, path=f"{path}.attributes", field=key) from None


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Messages flattened into indexed attributes (``<prefix>N.<field>``), in index order."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix):].partition(".")
        if index.isdigit() and rest:
            found.setdefault(int(index), {})[rest] = value
    return [found[i] for i in sorted(found)]


def span_messages(span: _Span, name: str) -> Optional[list[Any]]:
    """The messages an LLM span says it sent (see the module doc), or None when it carries none."""
    attrs = span.attrs
    if "gen_ai.input.messages" in attrs:
        messages = _json_attribute(attrs["gen_ai.input.messages"], span, "gen_ai.input.messages", name)
        if not isinstance(messages, list):
            line, path = span.where
            raise InputError("expected a JSON list of messages", file=name, line=line, path=f"{path}.attributes",
                             field="gen_ai.input.messages")
        system = attrs.get("gen_ai.system_instructions")
        if system is not None:
            parts = _json_attribute(system, span, "gen_ai.system_instructions", name)
            messages = [{"role": "system", "parts": parts}, *messages]
        return messages or None
    for prefix in ("gen_ai.prompt.", "llm.input_messages."):
        messages = _indexed(attrs, prefix)
        if messages:
            return messages
    if attrs.get("input.mime_type") == "application/json" and isinstance(attrs.get("input.value"), str):
        try:
            request = orjson.loads(attrs["input.value"])
        except orjson.JSONDecodeError:
            return None  # free-form input: not a request body
        if isinstance(request, dict) and isinstance(request.get("messages"), list):
            return request["messages"] or None
    return None


def _hash_content(spans: list[_Span], name: str, policy: ErrorPolicy, hasher: ContentHasher) -> int:
    """Give every LLM span with messages its hash ids, in the order the calls were sent, after fitting the
    hasher's size estimate to them; returns how many LLM spans carry no messages. A span whose messages
    cannot be read goes to the error policy."""
    without = 0
    found: list[tuple[_Span, list[Any], int]] = []
    for span in sorted(spans, key=lambda s: (s.start, s.end, s.id)):
        if span.operation not in LLM_OPERATIONS:
            continue
        try:
            messages = span_messages(span, name)
        except InputError as exc:
            policy.bad(exc)
            span.bad = True
            continue
        n_in = next((span.attrs[k] for k in _INPUT_KEYS if k in span.attrs), None)
        if not messages:
            without += 1
        elif type(n_in) is int and 0 < n_in <= MAX_TOKENS:  # a bad count is reported when the call is built
            found.append((span, messages, n_in))
    hasher.calibrate((messages, n_in) for _, messages, n_in in found)
    for span, messages, n_in in found:
        span.hash_ids = hasher.hash_ids(messages, n_in)
    return without


def _with_times(call: Call, gap: float, sent_at: float) -> Call:
    return Call(call.input_tokens, call.output_tokens, gap, call.hash_ids, call.block_size, call.server_time,
                sent_at, call.stop_reason, call.model, call.messages)


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read OTLP JSON (or JSON Lines of exports) or OTLP protobuf into agent tasks."""
    name = str(path)
    reader = _Reader(name, policy)
    with open(path, "rb") as fh:
        head = fh.read(65536)
    if _is_protobuf(path, head):
        for root, obj in otlp_proto.exports(path, name):
            reader.export(obj, None, root)
    else:
        for line, obj in _exports(path, name, policy):
            reader.export(obj, line)
    hasher = ContentHasher()
    without_content = _hash_content(reader.spans, name, policy, hasher)
    builder = _Builder(name, policy, hasher.block_size)
    found = builder.tasks(reader.spans)
    if not found:
        raise InputError("no GenAI LLM spans found (gen_ai.operation.name chat, text_completion or "
                         "generate_content, or openinference.span.kind LLM)", file=name)
    origin = min(start for start, _ in found)
    tasks = []
    for start, task in sorted(found, key=lambda pair: (pair[0], pair[1].id)):
        if start - origin > MAX_SECONDS * _NS:
            policy.bad(InputError(f"task {task.id} starts more than {MAX_SECONDS:g} s after the file's first",
                                  file=name, field="startTimeUnixNano"))
            continue
        tasks.append(Task(task.id, task.calls, (start - origin) / _NS, task.task_class, task.subtasks))
    wl = Workload(tuple(tasks))
    n_tasks, n_calls, n_subs = wl.counts()
    notes = [f"{len(reader.spans)} spans: {n_tasks} tasks, {n_subs} sub-agents, {n_calls} LLM calls"]
    if builder.overlaps:
        notes.append(f"{builder.overlaps} calls started before the previous call of their agent ended: gap set to 0")
    if builder.orphans:
        notes.append(f"{builder.orphans} spans name a parent that is not in the file: read as top-level")
    if builder.empty_agents:
        notes.append(f"{builder.empty_agents} agent spans without LLM calls left out")
    notes.extend(hasher.notes("LLM calls"))
    if without_content:
        notes.append(f"{without_content} LLM calls carry no messages: no hash ids for them "
                     "(--assume-append-only derives ids from the token counts)")
    return Workload(wl.tasks, (Provenance(name, FORMAT, {"on_error": policy.on_error}, tuple(notes)),))
