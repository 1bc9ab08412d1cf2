"""Options of the scheduler-side host-state cache (group ``[cache]``)."""

from __future__ import annotations

import socket

from oslo_config import cfg

GROUP = "cache"

cache_opts = [
    cfg.StrOpt("name", default=socket.gethostname(), sample_default="<hostname>",
               help="""
Name of this scheduler process. It is the control-plane server name that
compute reporters answer resync requests and claims to, and the scheduler
named in every claim, so it must be unique among running schedulers.

Related options: [control_plane] topic names.
"""),
    cfg.IntOpt("reorder_window", default=64, min=1,
               help="""
How many out-of-order deltas of one source are held while waiting for the
missing one. When the buffer would overflow, the source is asked to resync at
once.

Related options: reorder_timeout.
"""),
    cfg.FloatOpt("reorder_timeout", default=0.2, min=0.0,
                 help="""
Seconds a gap in one source's deltas may stay open before that source is asked
to resync from the version held. Larger values tolerate more reordering at the
price of staler views after a real loss.
"""),
    cfg.FloatOpt("resync_timeout", default=2.0, min=0.01,
                 help="""
Seconds to wait for a resync answer before asking again. Repeated attempts
back off exponentially up to resync_backoff_max.
"""),
    cfg.FloatOpt("resync_backoff_max", default=10.0, min=0.01,
                 help="""
Upper bound, in seconds, of the resync retry interval. Keep it at most the
reporters' heartbeat_interval, so that a view repaired by resync converges
within two heartbeat intervals even when resync messages are lost.
"""),
    cfg.FloatOpt("down_interval", default=30.0, min=0.1,
                 help="""
Seconds without any message from a source (heartbeats included) after which
it is marked down and no longer eligible. It is not forgotten: its next message
brings it back. Should be at least three times [reporter] heartbeat_interval.
"""),
    cfg.FloatOpt("claim_deadline", default=30.0, min=0.1,
                 help="""
Seconds a claim stays pending (deducted from the host in this scheduler's view)
without word from the compute node before it expires and is counted. Accepted
claims retire as soon as a delta lists them, so this only matters when a claim
or its answer is lost.
"""),
    cfg.FloatOpt("fence_timeout", default=1.0, min=0.0,
                 help="""
Seconds a decision waits at most for a change a source fenced. An API call
that disables, forces down or deletes a compute service returns only once its
change is on the stream and fenced: no decision here places on that service
before this scheduler has applied the change. A fence not met in time is
logged and the decision goes on.

Possible values: 0 (never wait), or seconds; keep it above the stream's
staleness p99 (shm_staleness_seconds).
"""),
    cfg.FloatOpt("tick_interval", default=0.05, min=0.001,
                 help="Seconds between timer checks (gaps, resync retries, claim deadlines)."),
    cfg.StrOpt("state_dir",
               help="""
Directory where the cache persists its stream offset and a periodic snapshot of
every source's document. On restart the scheduler loads it and resumes reading
the stream after that offset instead of resyncing every source. Unset: every
start is a cold start (stream from its retained start, then resyncs).
"""),
    cfg.FloatOpt("snapshot_interval", default=30.0, min=0.1,
                 help="Seconds between local snapshots written to state_dir."),
    cfg.FloatOpt("checkpoint_interval", default=10.0, min=0.0,
                 help="""
Seconds between checkpoints of this scheduler's whole view (every source's
version and document and the stream offset applied), published compressed on
the stream named like the host-state stream plus ".checkpoint". Only the
coordinator (the first live scheduler by name) publishes; a scheduler that
knows no peers publishes itself. A scheduler that starts without a state file
in state_dir restores the newest checkpoint (waiting up to 2 s for one once
attached to that stream) and reads the host-state stream from its offset:
ready in seconds rather than rebuilding every view from the stream and
resyncing the rest. No checkpoint, or a damaged one: a cold start as before.
A newcomer replays what the stream carried since the checkpoint: the shorter
the interval, the sooner it is ready (10 000 hosts changing every 10 s: about
1.5 s at 10, 5.4 s from a checkpoint 18 s old at 30), the more the publisher
spends (about 0.2 s of CPU a checkpoint at 10 000 hosts, 2 s at 100 000).
With [signing] enabled checkpoints are signed with a key derived from
master_key, which this scheduler then needs. Not the update log's checkpoints
([update_log] checkpoint_interval), which stay in its files.

Possible values: 0 (neither publish nor use checkpoints), or seconds.

Related options: state_dir, [signing] master_key.
"""),
    cfg.IntOpt("max_message_bytes", default=8 * 1024 * 1024, min=1024,
               help="Largest message accepted from the bus; larger ones are dropped and counted."),
    cfg.FloatOpt("membership_interval", default=0.0, min=0.0,
                 help="""
Seconds between publications of this scheduler's own entry on the stream
(source ``scheduler/<name>``: its name, start time and load). Schedulers that
decide with the project's engine read them to know their live peers, without
configuration, and claim first the hosts they own among them (rendezvous
hashing), which keeps concurrent decisions apart. A scheduler that stops says
so at once; one that crashes is dropped by its peers 1.5 intervals after they
last heard of it. 0 (the default): publish nothing. Set it (e.g. 2) only where
this process decides: a cache that only watches (``shm scheduler``) or decides
with nova's own weighers (``nova-scheduler-shared``) must not take a share of
the hosts.
"""),
    cfg.BoolOpt("announce_claims", default=True,
                help="""
Cast every claim this scheduler sends to its host to its live peers too (those
known from ``membership_interval``; none without it). A peer deducts the claim
in its view until the host's next delta lists it, instead of deciding on the
same capacity in the milliseconds before that delta arrives: most claims
rejected between active-active schedulers are decided in that window. One
extra cast per peer per claim; the build request is not sent.
nova-scheduler-shared announces each claim placement accepted, so its peers
stop choosing that host before the compute reports the instance.
"""),
    cfg.FloatOpt("placement_max_staleness", default=5.0, min=0.1,
                 help="""
Seconds without any message from the placement feed's source (its heartbeats
included) after which this scheduler stops answering allocation candidates
from its copy of placement (docs/design.md section 11): every request goes to
placement itself, counted with reason stale, and /healthz stays 200 but
says "degraded: placement view stale" (decisions stay correct). A source
that said goodbye is stale at once.
Without a placement feed nothing changes: requests go to placement (reason
no_feed) and health is not affected.

Related options: [placement_feed] heartbeat_interval (keep it well below
this).
"""),
    cfg.FloatOpt("peer_claim_ttl", default=1.0, min=0.0,
                 help="""
Seconds at most a peer's announced claim is deducted. Its host's delta retires
it sooner (tens of milliseconds); one the host rejected, or whose delta was
lost, holds its resources in this view until then. Keep it above the time a
claim's delta takes to reach the schedulers. With nova-scheduler-shared that
delta comes when nova-compute's resource tracker reports the instance, seconds
after placement's claim: raise it to cover a build's start.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(cache_opts, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, cache_opts)]
