"""Property tests of the retention log behind the in-process stream."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from transport.streamlog import StreamLog


def _model(bodies: list[bytes], max_messages: int | None,
           max_bytes: int | None) -> tuple[int, list[bytes]]:
    """Naive reference: drop from the head while over a limit, never the
    newest entry."""
    kept: list[tuple[int, bytes]] = []
    for offset, body in enumerate(bodies):
        kept.append((offset, body))
        while len(kept) > 1 and (
                (max_messages is not None and len(kept) > max_messages)
                or (max_bytes is not None
                    and sum(len(b) for _, b in kept) > max_bytes)):
            kept.pop(0)
    first = kept[0][0] if kept else 0
    return first, [b for _, b in kept]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=3000),
    max_messages=st.none() | st.integers(min_value=1, max_value=50),
    max_bytes=st.none() | st.integers(min_value=1, max_value=600),
)
def test_log_matches_naive_model(sizes, max_messages, max_bytes):
    log = StreamLog(max_messages=max_messages, max_bytes=max_bytes)
    bodies = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    for expected_offset, body in enumerate(bodies):
        assert log.append(body) == expected_offset
    first, kept = _model(bodies, max_messages, max_bytes)
    assert log.next_offset == len(bodies)
    assert log.first_offset == first
    assert len(log) == len(kept)
    assert log.retained_bytes == sum(map(len, kept))
    assert log.dropped_messages == len(bodies) - len(kept)
    start, got = log.read(0, len(bodies) + 1)
    assert start == first and [body for body, _ in got] == kept
    if kept:
        mid = first + len(kept) // 2
        start, got = log.read(mid, 3)
        assert start == mid and [body for body, _ in got] == kept[mid - first:mid - first + 3]
    assert log.read(log.next_offset, 10) == (log.next_offset, [])


def test_compaction_keeps_offsets_stable():
    log = StreamLog(max_messages=10)
    for i in range(50_000):
        log.append(b"%d" % i)
    assert log.first_offset == 49_990
    start, got = log.read(49_995, 100)
    assert start == 49_995 and got == [(b"%d" % i, None) for i in range(49_995, 50_000)]
    assert len(log._items) < 5000  # dropped entries were physically freed
