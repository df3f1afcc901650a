"""The incremental SSE parser: events survive any split of the byte stream."""

import pytest

from simulator.live.sse import SSEError, SSEParser

STREAM = (
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"text":" caf\xc3\xa9"}]}\n\n'
    b"event: message\r\nid: 7\r\n"
    b'data: {"a":1}\r\n\r\n'
    b"data: line one\ndata: line two\n\n"
    b"data:no-space\r\rdata: [DONE]\n\n"
)
EXPECTED = [
    '{"choices":[{"text":" café"}]}'.encode(), b'{"a":1}', b"line one\nline two", b"no-space", b"[DONE]"
]


def parse(chunks):
    parser = SSEParser()
    events = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events


def test_whole_stream():
    assert parse([STREAM]) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_split_at_every_byte(cut):
    assert parse([STREAM[:cut], STREAM[cut:]]) == EXPECTED


def test_one_byte_at_a_time():
    assert parse([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_three_way_splits():
    for a in range(1, len(STREAM), 7):
        for b in range(a + 1, len(STREAM), 5):
            assert parse([STREAM[:a], STREAM[a:b], STREAM[b:]]) == EXPECTED


def test_unterminated_last_event_is_returned_by_close():
    parser = SSEParser()
    assert parser.feed(b"data: x\n") == []
    assert parser.pending
    assert parser.close() == [b"x"]
    assert not parser.pending


def test_malformed_line_raises():
    parser = SSEParser()
    with pytest.raises(SSEError, match="not a server-sent-event line"):
        parser.feed(b'{"choices": []}\n\n')
