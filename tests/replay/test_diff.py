"""--diff: the first version at which two logs' views diverged, and why."""

from __future__ import annotations

from protocol import codec
from protocol.document import SET
from protocol.messages import Batch, Delta
from shared_host_manager.updatelog.diff import diff_logs
from shared_host_manager.updatelog.reader import resolve_log


def _diff(run, a, b):
    return diff_logs(resolve_log(run.log(a)), resolve_log(run.log(b)))


def _first_versions(deltas):
    out = {}
    for d in deltas:
        out[d.source] = min(out.get(d.source, (d.epoch, d.seq)), (d.epoch, d.seq))
    return out


def test_schedulers_that_saw_the_same_stream_do_not_diverge(mini_run):
    run = mini_run()
    run.run(25)
    run.settle(10)
    run.close()
    d = _diff(run, "s0", "s1")
    assert d.common == len(run.sources) and not d.diverged and not d.only_a and not d.only_b
    assert d.a.ok and d.b.ok


def test_a_lost_delta_shows_at_its_version_against_a_scheduler_and_the_reporter(mini_run):
    run = mini_run()
    run.run(10)
    run.drop_delta["s1"] = ""
    run.run(10)
    run.settle(20)
    assert run.converged()
    run.close()
    lost = _first_versions(run.dropped["s1"])
    assert lost
    for other in ("s0", "r0"):
        d = _diff(run, other, "s1")
        found = {x.source: x for x in d.diverged}
        assert set(found) == set(lost), (other, [x.as_dict() for x in d.diverged])
        for source, version in lost.items():
            x = found[source]
            assert x.version == version and x.side == "b"
            assert x.kind in ("missed_delta", "late_resync")
            assert "resync answer" in x.b and "missed delta" in x.text
        # the explanation names the stream message this scheduler never got
        assert all("stream offsets never received" in x.text or "heartbeat" in x.text
                   for x in d.diverged)


def test_a_rejected_claims_correction_is_named(mini_run):
    run = mini_run()
    run.run(10)
    source = "cn03"
    run.drop_delta["s1"] = source
    run.sources[source].change([[SET, "compute", "num_io_ops", 7]], run.clock())
    run.publish()
    run.deliver()
    [missed] = [d for d in run.dropped["s1"] if d.source == source]
    claim = run.claim("s1", source, {"vcpus": 1000})  # based on the version before `missed`
    assert (claim.epoch, claim.seq) == (missed.epoch, missed.seq - 1)
    run.settle(10)
    assert run.converged()
    run.close()
    d = _diff(run, "s0", "s1")
    x = next(x for x in d.diverged if x.source == source)
    assert x.version == (missed.epoch, missed.seq)
    assert x.kind == "rejected_claim" and x.side == "b"
    assert claim.claim_id in x.text and "correction" in x.b


def test_same_version_with_different_content_is_a_content_divergence(mini_run):
    run = mini_run()
    run.run(8)
    source = "cn05"
    forged = {}

    def forge(offset, body):
        msg = codec.decode(body)
        items = []
        for item in msg.items:
            if type(item) is Delta and item.source == source and not forged:
                forged["version"] = (item.epoch, item.seq)
                item = Delta(item.source, item.epoch, item.seq,
                             [op if op[2] != "num_io_ops" else [SET, "compute", "num_io_ops", 99]
                              for op in item.ops] + [[SET, "metrics", "forged", True]], item.claims)
            items.append(item)
        return codec.encode(Batch(items, msg.origin))

    run.rewrite["s1"] = forge
    run.run(6)
    del run.rewrite["s1"]
    run.settle(20)
    assert run.converged()  # the heartbeat showed the divergence; a full resync repaired it
    assert run.caches["s1"].receiver.stats["divergences"] >= 1
    run.close()
    d = _diff(run, "s0", "s1")
    x = next(x for x in d.diverged if x.source == source)
    assert x.version == forged["version"] and x.kind == "content"
    d = _diff(run, "r0", "s1")
    assert next(x for x in d.diverged if x.source == source).kind == "content"


def test_two_live_schedulers_a_few_messages_apart_are_compared_at_the_same_offset(mini_run):
    """One scheduler's log ends a few stream messages after the other's (the logs of two live
    processes, copied a moment apart): cut at the last offset both applied, nothing diverged;
    compared whole, every source changed since is "behind"."""
    run = mini_run(checkpoint_interval=0.1)
    run.run(20)
    run.settle(5)
    s1 = run.caches.pop("s1")  # s1 stops reading; s0 goes on
    run.run(5, changes=8)
    run.caches["s1"] = s1
    run.close()
    a, b = resolve_log(run.log("s0")), resolve_log(run.log("s1"))
    aligned = diff_logs(a, b)
    assert aligned.aligned_at is not None and aligned.aligned_at[0] == "offset"
    assert aligned.diverged == [] and aligned.common == 8
    whole = diff_logs(a, b, align=False)
    assert whole.diverged and {d.kind for d in whole.diverged} == {"behind"}
    last = aligned.aligned_at[1]
    earlier = diff_logs(a, b, at_offset=int(last) - 3)
    assert earlier.diverged == [] and earlier.aligned_at == ("offset", int(last) - 3)
