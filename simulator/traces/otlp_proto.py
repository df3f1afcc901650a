"""OTLP protobuf trace files, decoded into the dicts of OTLP JSON so one reader serves both encodings.

A file is either one binary ``ExportTraceServiceRequest`` (equally a ``TracesData``: the same wire layout,
``resource_spans`` as field 1), as an exporter's encoder writes it, or a stream of such messages each
preceded by its length as a 4-byte big-endian unsigned integer, as the OpenTelemetry Collector's file
exporter writes with ``format: proto``. Decoding uses the ``opentelemetry-proto`` package (imported only
when a protobuf file is read). Span and trace ids become lowercase hex strings and 64-bit times integers,
as in OTLP JSON; attribute values keep OTLP JSON's ``AnyValue`` shape (``stringValue``, ``intValue``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ..errors import InputError

_RESOURCE_SPANS_TAG = 0x0A  # field 1, length-delimited
_INNER_TAGS = frozenset({0x0A, 0x12, 0x1A})  # ResourceSpans: resource, scope_spans, schema_url


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`; (-1, pos) when it is cut off or too long."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    return -1, pos


def _starts_message(data: bytes, pos: int, size: int) -> bool:
    """Whether a trace request plausibly starts at `pos` of a message `size` bytes long: a ResourceSpans
    field whose length fits and whose first inner field is one ResourceSpans has."""
    if pos >= len(data) or data[pos] != _RESOURCE_SPANS_TAG:
        return False
    length, inner = _varint(data, pos + 1)
    if length <= 0 or inner - pos + length > size:
        return False
    return inner >= len(data) or data[inner] in _INNER_TAGS


def sniff(path: Path, head: bytes) -> bool:
    """True for a binary OTLP trace request, bare or length-prefixed."""
    if not head:
        return False
    try:
        size = path.stat().st_size
    except OSError:
        size = len(head)
    if _starts_message(head, 0, size):
        return True
    if len(head) >= 5:
        length = int.from_bytes(head[:4], "big")
        return 0 < length <= size - 4 and _starts_message(head, 4, length)
    return False


def _frames(data: bytes) -> list[bytes] | None:
    """The messages of a length-prefixed stream, or None when the file is not one."""
    frames = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            return None
        length = int.from_bytes(data[pos:pos + 4], "big")
        if pos + 4 + length > len(data):
            return None
        frames.append(data[pos + 4:pos + 4 + length])
        pos += 4 + length
    return frames if frames else None


def exports(path: Path, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON path root, export as OTLP JSON dicts) for each message of the file: root ``$`` for a bare
    message, ``$[i]`` for the i-th message of a length-prefixed stream."""
    try:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:
        raise InputError("reading OTLP protobuf needs the opentelemetry-proto package "
                         "(pip install opentelemetry-proto)", file=name) from None
    data = path.read_bytes()
    if not data.strip():
        raise InputError("empty file", file=name)
    framed = None if data[0] == _RESOURCE_SPANS_TAG else _frames(data)
    messages = [("$", data)] if framed is None else [(f"$[{i}]", frame) for i, frame in enumerate(framed)]
    for root, raw in messages:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(raw)
        except (DecodeError, ValueError) as exc:
            where = "" if root == "$" else f" (message {root[2:-1]} of the length-prefixed stream)"
            raise InputError(f"not an OTLP protobuf trace request{where}: {exc}", file=name, path=root) from None
        yield root, _request(request)


def _request(request: Any) -> dict[str, Any]:
    return {"resourceSpans": [
        {"resource": {"attributes": [_kv(kv) for kv in rs.resource.attributes]},
         "scopeSpans": [{"scope": {"name": ss.scope.name, "version": ss.scope.version},
                         "spans": [_span(sp) for sp in ss.spans]} for ss in rs.scope_spans]}
        for rs in request.resource_spans
    ]}


def _span(span: Any) -> dict[str, Any]:
    return {
        "traceId": span.trace_id.hex(),
        "spanId": span.span_id.hex(),
        "parentSpanId": span.parent_span_id.hex(),
        "name": span.name,
        "kind": int(span.kind),
        "startTimeUnixNano": int(span.start_time_unix_nano),
        "endTimeUnixNano": int(span.end_time_unix_nano),
        "attributes": [_kv(kv) for kv in span.attributes],
    }


def _kv(kv: Any) -> dict[str, Any]:
    return {"key": kv.key, "value": _any(kv.value)}


def _any(value: Any) -> dict[str, Any]:
    """An AnyValue as OTLP JSON writes it."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": value.string_value}
    if which == "int_value":
        return {"intValue": int(value.int_value)}
    if which == "double_value":
        return {"doubleValue": float(value.double_value)}
    if which == "bool_value":
        return {"boolValue": bool(value.bool_value)}
    if which == "array_value":
        return {"arrayValue": {"values": [_any(v) for v in value.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": [_kv(kv) for kv in value.kvlist_value.values]}}
    return {}
