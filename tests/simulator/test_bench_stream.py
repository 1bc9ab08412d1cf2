"""shm bench stream with cells over the real RabbitMQ: the sources spread over a reporter
process and a stream per cell, every scheduler reading every cell, and the four cold starts
ready with every source (no timing checked)."""

from __future__ import annotations

import json
import queue

import pytest
from integration.conftest import KOMBU_URL, _probe, _unavailable

from simulator.bench_stream import _ready, _share, main

# minutes of CPU: beside the rest of the suite, in a pytest process of its own
pytestmark = pytest.mark.background


def test_the_sources_are_shared_out_evenly_over_the_cells() -> None:
    assert [_share(10, 4, k) for k in range(4)] == [3, 3, 2, 2]
    assert sum(_share(10_000, 7, k) for k in range(7)) == 10_000


def test_more_cells_than_sources_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--sources", "2", "--cells", "3"])
    assert exit_.value.code == 2
    assert "--cells 3: from 0 to --sources (2)" in capsys.readouterr().err


def test_a_non_positive_cold_timeout_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--cold-timeout", "0"])
    assert exit_.value.code == 2
    assert "--cold-timeout 0: must be > 0" in capsys.readouterr().err


def test_an_unknown_cold_start_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--cold-starts", "checkpoint,warm"])
    assert exit_.value.code == 2
    assert "--cold-starts: choose from checkpoint, newest, stream, window (got warm)" in \
        capsys.readouterr().err


def test_a_scheduler_that_is_never_ready_times_out_and_a_late_report_is_not_taken() -> None:
    ready: queue.Queue = queue.Queue()
    assert _ready(ready, "bench-cold-window", 0.05) is None
    # the one stopped after its timeout reports late; the next one's figure is its own
    ready.put(("bench-cold-window", 99.0))
    ready.put(("bench-fresh", 1.5))
    assert _ready(ready, "bench-fresh", 1.0) == 1.5


@pytest.mark.rabbit
@pytest.mark.slow
def test_cells_every_stream_read_and_every_cold_start_ready(tmp_path) -> None:
    problem = _probe()
    if problem:
        _unavailable(problem)
    out = tmp_path / "stream.json"
    assert main(["--sources", "60", "--cells", "3", "--duration", "4", "--down", "1",
                 "--checkpoint-interval", "1", "--cold-settle", "0.5", "--url", KOMBU_URL,
                 "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["cells"] == 3
    assert figures["timed_out"] == []
    # changes of every cell reached both schedulers (those made 2 to 3 s into the run)
    assert figures["deltas_measured"] > 0
    assert figures["invalid"] == [{}, {}]
    assert figures["restart_resyncs"] == 0
    # the newcomer started from a checkpoint (its age: from when it was taken to the newcomer's
    # start, below 0 for one taken while it started), which carried every cell's offset: it
    # asked no source
    assert "cold_checkpoint_checkpoint_age_s" in figures, figures
    # whether its ask was answered in time is not asked here: with a checkpoint every second
    # the newest is younger than the wait for an answer (tests/services/test_checkpoint.py and
    # tests/integration/test_checkpoint_rabbit.py check the answer)
    assert figures["cold_checkpoint_resync_requests"] == 0
    # the newest periodic checkpoint, not asked for: the way before asks
    assert not figures["cold_newest_checkpoint_answered"], figures
    assert figures["cold_newest_resync_requests"] == 0
    for mode in ("checkpoint", "newest", "stream", "window"):
        assert figures[f"cold_{mode}_ready_s"] == figures[f"cold_{mode}_ready_s"]  # not NaN
    # retention from the checkpoint's offsets on, in every cell: each source resynced once
    assert figures["cold_window_resync_requests"] >= 60
