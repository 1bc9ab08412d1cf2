"""poll() acts on every deadline next_deadline() reports as due (no spinning edge)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.document import SET
from protocol.source import SourceMachine


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 1e6, allow_nan=False), st.floats(1e-4, 1.0), st.floats(0.01, 60.0),
       st.floats(0.0, 1.0), st.lists(st.floats(0.0, 5.0), min_size=1, max_size=20))
def test_a_due_deadline_is_always_consumed(start, window, interval, phase, steps):
    m = SourceMachine("s", 1, {"compute": {"vcpus": 1}}, coalesce_window=window,
                      heartbeat_interval=interval, heartbeat_phase=phase)
    now = start
    m.poll(now)
    for i, step in enumerate(steps):
        now += step
        m.change([[SET, "metrics", "n", i]], now)
        due = m.next_deadline()
        while due is not None and due <= now:
            m.poll(now)
            after = m.next_deadline()
            assert after is None or after > now, (due, after, now)
            due = after


def test_rounding_case_that_made_a_reporter_spin():
    # pending_since + window == now, yet now - pending_since < window in floating point
    start, window = 134364.2441124012, 0.05
    now = start + window
    assert not now - start >= window  # the trap itself
    m = SourceMachine("s", 1, {"compute": {"vcpus": 1}}, coalesce_window=window,
                      heartbeat_interval=1e9)
    m.poll(start - 1.0)
    m.change([[SET, "metrics", "n", 1]], start)
    assert m.next_deadline() <= now
    sent = m.poll(now)
    assert [type(s.message).__name__ for s in sent] == ["Delta"]
    assert m.next_deadline() > now
