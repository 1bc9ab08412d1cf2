"""Options of the placement feed (group ``[placement_feed]``), read by ``shm placement-feed``.

The placement feed reads placement's database and publishes every resource
provider on the stream as one source (docs/design.md §11); its reporter's
options ([reporter], [data_plane], [control_plane], [signing]) are the ones
every reporter reads.  ``connection`` is required.

Entry point (``oslo.config.opts``): ``shm.placement_feed =
shared_host_manager.conf.placement_feed:list_opts``.
"""

from __future__ import annotations

from oslo_config import cfg

GROUP = "placement_feed"

placement_feed_opts = [
    cfg.StrOpt("connection", secret=True, help="""
SQLAlchemy URL of placement's database: the value of placement.conf's
``[placement_database] connection`` (for example
``mysql+pymysql://placement:PASSWORD@db-host/placement``). The feed only
reads it; a read-only database user is enough (SELECT on placement's
tables). Required.
"""),
    cfg.StrOpt("source_name", default="placement", help="""
Name of the source the feed publishes (its document holds the namespaces
``placement`` and ``placement_meta``). One feed per placement database: a
source has one writer. Schedulers find it by its ``placement_meta``
namespace, not by this name.
"""),
    cfg.FloatOpt("poll_interval", default=0.2, min=0.01, help="""
Seconds between two looks at placement's database. A look is two one-row
queries (providers, sum of their generations, highest id; allocation rows
and their sum): about 8 ms at 1 000 providers, 16 ms at 10 000 on MariaDB,
measured on a loaded machine. Only when it moved does the feed list every
provider's mark (40 ms at 1 000, 320 ms at 10 000) and read the providers
whose mark changed (25 to 50 ms for ten). A change reaches the schedulers
within poll_interval plus the time to read and publish it.

Related options: full_check_interval.
"""),
    cfg.FloatOpt("full_check_interval", default=10.0, min=0.1, help="""
Seconds after which the feed lists every provider's generation even though
the one-row check did not move (a backstop, never needed while placement
only increments generations and never reuses a provider id).
"""),
    cfg.IntOpt("max_reads", default=2000, min=1, help="""
Providers read and published at most per poll; the rest wait for the next
poll. Bounds the size of one publish when many providers change at once
(after a broker outage, for instance).
"""),
    cfg.FloatOpt("publish_timeout", default=2.0, min=0.1, help="""
Seconds the feed waits for the broker to confirm a publish. An unconfirmed
publish leaves its providers dirty: they are read and published again at
the next poll.
"""),
    cfg.FloatOpt("heartbeat_interval", default=1.0, min=0.01, help="""
Seconds between the feed source's heartbeats (it replaces [reporter]
heartbeat_interval for this source). Schedulers stop answering allocation
candidates from memory when the source has been silent for their
[cache] placement_max_staleness (5 s): keep this well below it.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(placement_feed_opts, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, placement_feed_opts)]
