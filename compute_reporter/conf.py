"""Options of the compute reporter (group ``[reporter]``)."""

from __future__ import annotations

import socket

from oslo_config import cfg

GROUP = "reporter"

reporter_opts = [
    cfg.StrOpt("name", default=socket.gethostname(), sample_default="<hostname>",
               help="""
Name of this reporter: its control-plane server name, to which schedulers send
claims and resync requests for every host it serves. Published in each host's
document (service.endpoint) and with every batch.
"""),
    cfg.FloatOpt("coalesce_window", default=0.05, min=0.0,
                 help="""
Seconds during which changes of one host are merged into one delta (the last
write per key wins). Shorter: fresher views and more messages. Claims are
published at once regardless.
"""),
    cfg.FloatOpt("heartbeat_interval", default=10.0, min=0.01,
                 help="""
Seconds between heartbeats of each host (version and digest, for liveness and
anti-entropy). Related options: [cache] down_interval should be >= 3x this.
"""),
    cfg.IntOpt("ring_size", default=256, min=1,
               help="""
Recent deltas kept per host to answer resyncs; older gaps get a
snapshot. At most 256 are kept (a resync answer carries no more). Their
memory is bounded by hosts x ring_size x the size of a delta (about 400
bytes for a delta of two ops); it fills in ring_size changes of each
host, then stays.
"""),
    cfg.IntOpt("max_batch_items", default=500, min=1,
               help="Most data items (deltas, heartbeats; a snapshot counts 20) in one stream message."),
    cfg.StrOpt("state_dir",
               help="""
Directory where the reporter persists each host's epoch, so that a restart is
always announced with a newer epoch even if the clock went backwards.
"""),
    cfg.StrOpt("tracker", default="simulated",
               help="""
Where ``shm reporter`` learns its hosts and their changes.

Possible values:

* ``simulated``: simulated_hosts synthetic compute nodes that drift (load
  tests, the simulator, a rehearsal of a deployment's stream).
* ``package.module:factory``: a resource-tracker adapter you provide;
  ``factory(conf)`` returns an object with the methods of
  ``compute_reporter.tracker.ResourceTracker``.

On a nova compute node, run ``nova-compute-shared`` instead: nova's resource
tracker is the tracker there, and this option is not read.
"""),
    cfg.IntOpt("simulated_hosts", default=1, min=0,
               help="Number of simulated hosts this reporter serves (tracker=simulated)."),
    cfg.IntOpt("simulated_seed", default=0,
               help="Seed of the simulated hosts (capacities and changes)."),
    cfg.FloatOpt("simulated_change_interval", default=1.0, min=0.0,
                 help="Mean seconds between changes of each simulated host; 0 disables drift."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(reporter_opts, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, reporter_opts)]
