"""shm bench ingest: the cloud's messages (one source each, in order, decodable) and a small
run over the real RabbitMQ (every message applied, no gap, no resync, a newcomer ready from
the checkpoint; no timing checked)."""

from __future__ import annotations

import json

import pytest
from integration.conftest import KOMBU_URL, _probe, _unavailable

from protocol.codec import Decoder
from protocol.messages import Batch, Delta, Heartbeat, Snapshot
from simulator.bench_ingest import generate, main


def test_every_host_announces_then_changes_and_beats_at_its_rates() -> None:
    out = generate(300, 3, 60.0, change_interval=10.0, heartbeat_interval=10.0, seed=3)
    assert sorted(out) == ["cell1", "cell2", "cell3"]
    decoder = Decoder()
    kinds: dict[type, int] = {}
    seqs: dict[str, int] = {}
    for cell, messages in out.items():
        times = [t for t, _ in messages]
        assert times == sorted(times)
        for i, (_, body) in enumerate(messages):
            batch = decoder.decode(body)
            assert type(batch) is Batch and len(batch.items) == 1  # one source a message
            item = batch.items[0]
            assert item.source.startswith(f"{cell}-")
            kinds[type(item)] = kinds.get(type(item), 0) + 1
            if i < 100:
                assert type(item) is Snapshot  # every host's announcement first
            if type(item) is Delta:
                assert item.seq == seqs.get(item.source, 0) + 1  # in order, no gap
                seqs[item.source] = item.seq
    assert kinds[Snapshot] == 300
    # 300 hosts for 60 s: about 1 800 changes and 1 800 heartbeats
    assert 1200 < kinds[Delta] < 2400 and 1200 < kinds[Heartbeat] < 2400


@pytest.mark.rabbit
@pytest.mark.slow
def test_a_small_cloud_is_applied_whole(tmp_path) -> None:
    problem = _probe()
    if problem:
        _unavailable(problem)
    rabbit_url = KOMBU_URL
    out = tmp_path / "ingest.json"
    assert main(["--hosts", "200", "--cells", "2", "--backlog", "2", "--live", "3",
                 "--checkpoint-interval", "1", "--url", rabbit_url, "--timeout", "120",
                 "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["catch_up"]["complete"] and figures["live"]["complete"]
    assert figures["sources"]["held"] == 200
    receiver = figures["receiver"]
    assert receiver["snapshots"] == 200
    assert receiver["gaps"] == receiver["resyncs_requested"] == receiver["divergences"] == 0
    assert figures["needed_messages_per_s"] == round(200 * (1 / 60 + 1 / 10))
    # the newcomer started from the newest checkpoint, with nothing on the deployment's stream
    newcomer = figures["newcomer"]
    assert newcomer["ready"] and newcomer["restored_sources"] == 200
    assert newcomer["resyncs_requested"] == 0
