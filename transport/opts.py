"""Configuration options of the transport package.

Role: declare the ``[data_plane]`` and ``[control_plane]`` oslo.config
options (with nova-style help) and expose them to
``oslo-config-generator`` through ``list_opts()`` (entry point
``oslo.config.opts``: ``shm.transport = transport.opts:list_opts``).

Life cycle: the option objects are module constants; ``register_opts``
attaches them to a ``ConfigOpts`` (idempotent) before
``transport.factory`` reads them. Nothing here opens a connection.
"""

from __future__ import annotations

from oslo_config import cfg

from transport import signing_opts

__all__ = [
    "CONTROL_PLANE_GROUP",
    "CONTROL_PLANE_OPTS",
    "DATA_PLANE_GROUP",
    "CELL_GROUP_TEMPLATE",
    "CELL_OPTS",
    "DATA_PLANE_OPTS",
    "cell_group",
    "register_cell_groups",
    "list_opts",
    "register_opts",
]

DATA_PLANE_GROUP = cfg.OptGroup(
    "data_plane",
    title="Host-state data plane",
    help="""
The data plane carries deltas, snapshots and heartbeats from every source
(compute nodes, the aggregate catalogue, foreign services) to every
scheduler. It is one ordered, replayable stream that stores each message
once; each scheduler reads it at its own offset and resumes from the
offset it last applied.
""")

CONTROL_PLANE_GROUP = cfg.OptGroup(
    "control_plane",
    title="Claims and resync control plane",
    help="""
The control plane carries point-to-point casts: claims from a scheduler to
a compute node, claim results and corrections back to the scheduler, and
resync requests and answers. Delivery is at most once; the protocol copes
with loss through claim deadlines and resync requests.
""")

DATA_PLANE_OPTS = [
    cfg.StrOpt(
        "backend",
        default="inprocess",
        choices=[
            ("inprocess", "An in-memory stream inside this process. Only "
                          "parties in the same process see each other; "
                          "for the embedded mode, tests and the simulator."),
            ("rabbit", "A RabbitMQ stream queue read and written with "
                       "kombu; for a real deployment."),
        ],
        help="""
Where the host-state stream lives.

Possible values:

* ``inprocess``: no broker; every party must run in this process.
* ``rabbit``: a RabbitMQ (3.9 or newer) stream queue.

Related options:

* ``stream_url`` and the ``stream_*`` options apply to ``rabbit``.
* ``inprocess_*`` options apply to ``inprocess``.
* ``[control_plane] backend`` chooses the control plane separately.
"""),
    cfg.StrOpt(
        "stream_url",
        secret=True,
        help="""
kombu URL of the RabbitMQ broker holding the stream, for example
``amqp://shm:secret@rabbit1:5672//`` (the path after the port is the
virtual host; ``//`` means ``/``). Note the ``amqp://`` scheme: this is
kombu, not an oslo.messaging ``rabbit://`` transport URL.

Possible values:

* An ``amqp://`` or ``amqps://`` URL. Required when ``backend`` is
  ``rabbit``.

Related options:

* ``backend``
* ``[control_plane] transport_url`` may point at the same broker.
"""),
    cfg.StrOpt(
        "stream_name",
        default="shm-hoststate",
        help="""
Name of the stream queue. Every reporter and scheduler of one deployment
(or one cell) must use the same name; the stream is declared with it on
first use.

Possible values:

* Any RabbitMQ queue name not used by another queue type.

Related options:

* ``stream_max_age``, ``stream_max_length_bytes``
"""),
    cfg.StrOpt(
        "cell",
        help="""
The nova cell this process publishes in (a reporter, a ``nova-compute-shared``).
With a cell, its messages go to the cell's own stream, ``<stream_name>.<cell>``,
on the broker of ``stream_url`` (the cell's broker), as a compute of cells v2
talks only to its own cell's message queue. Unset: the deployment's one stream
``stream_name`` (a single cell, or the API level: the nova-api and placement
feeds, the schedulers' own entries).

Possible values:

* A cell name: letters, digits, ``_`` and ``-``; not ``default``.

Related options:

* ``cells``: the schedulers read every cell's stream.
"""),
    cfg.ListOpt(
        "cells",
        default=[],
        help="""
The cells whose streams a scheduler reads, besides the stream ``stream_name``
(which it always reads). Each cell's stream is ``<stream_name>.<cell>`` on the
broker named by ``stream_url`` in the section ``[data_plane:<cell>]`` (default:
this section's ``stream_url``); every other setting is this section's. Each
stream is read at its own offset, with its own catch-up, gap detection and
metrics; a cell whose broker is down leaves the others undisturbed: its hosts
go down after ``[cache] down_interval`` and rejoin from the cell stream's
offset when the broker is back.

Possible values:

* Empty (default): one stream for the whole deployment.
* Cell names: letters, digits, ``_`` and ``-``; not ``default``.

Related options:

* ``cell``: what a compute in one of these cells sets.
"""),
    cfg.StrOpt(
        "stream_max_age",
        default="1h",
        regex=r"^([1-9][0-9]*[YMDhms])?$",
        help="""
Retention by age (``x-max-age``): messages older than this are deleted,
one segment file at a time. A scheduler that restarts can only replay
what is still retained, so keep this longer than the interval between the
snapshots it restarts from plus the longest restart you want to survive
without a full resync.

Possible values:

* A positive integer followed by one unit: ``Y``, ``M``, ``D``, ``h``,
  ``m`` or ``s`` (e.g. ``1h``, ``7D``).
* Empty: no age limit.

Related options:

* ``stream_max_length_bytes``: whichever limit is hit first applies.
* Retention is fixed when the stream is first declared; changing it later
  takes a RabbitMQ policy (a mismatch is logged, not fatal).
"""),
    cfg.IntOpt(
        "stream_max_length_bytes",
        default=1024 ** 3,
        min=0,
        help="""
Retention by size (``x-max-length-bytes``): the oldest segments are deleted
once the stream is larger than this. As a guide, 10 000 compute nodes each
sending a 300-byte delta every 10 s produce about 1 GiB per hour.

Possible values:

* A positive number of bytes.
* 0: no size limit (not recommended: the stream then only shrinks by
  age).

Related options:

* ``stream_max_age``
* ``stream_max_segment_size_bytes``: retention works in whole segments.
"""),
    cfg.IntOpt(
        "stream_max_segment_size_bytes",
        default=0,
        min=0,
        help="""
Size of one stream segment file (``x-stream-max-segment-size-bytes``).
Retention deletes whole segments and only when a new segment starts, so
the stream can exceed ``stream_max_length_bytes`` by up to one segment.

Possible values:

* 0: the broker default (500 MB).
* A positive number of bytes; small values make retention finer but
  create many files.

Related options:

* ``stream_max_length_bytes``
"""),
    cfg.IntOpt(
        "prefetch_count",
        default=1000,
        min=1,
        help="""
How many stream messages the broker may send a consumer ahead of its
acknowledgements (``basic.qos``). Streams require a value above zero.
Larger values raise replay throughput at the cost of client memory.

Possible values:

* A positive integer.

Related options:

* None.
"""),
    cfg.BoolOpt(
        "publisher_confirms",
        default=True,
        help="""
Wait for the broker to confirm every published stream message. With
confirms a message is stored at least once even across a broker or
connection failure (a retried message stored twice is dropped by
consumers). Without confirms publishing is roughly twice as fast but a
message in flight when the connection dies can be lost; the protocol
then detects the gap by sequence number and resyncs.

Possible values:

* True or False.

Related options:

* ``publish_timeout``
"""),
    cfg.FloatOpt(
        "publish_timeout",
        default=30.0,
        min=0.1,
        help="""
How long, in seconds, one publish may keep retrying (reconnecting with
backoff) before it fails. The publishing thread is blocked meanwhile.

Possible values:

* A positive number of seconds.

Related options:

* ``reconnect_interval``, ``reconnect_interval_max``
"""),
    cfg.FloatOpt(
        "connect_timeout",
        default=5.0,
        min=0.1,
        help="""
Timeout, in seconds, for opening a TCP/AMQP connection to the broker.

Possible values:

* A positive number of seconds.

Related options:

* ``publish_timeout``
"""),
    cfg.IntOpt(
        "heartbeat",
        default=30,
        min=0,
        help="""
AMQP heartbeat, in seconds, of stream consumer connections, so that a
consumer notices a dead broker even when no message arrives. Publisher
connections do not use heartbeats: they notice failures when publishing.

Possible values:

* 0: disabled.
* A positive number of seconds.

Related options:

* None.
"""),
    cfg.FloatOpt(
        "reconnect_interval",
        default=0.1,
        min=0.01,
        help="""
First delay, in seconds, before reconnecting to the broker after a
failure. The delay doubles after each failed attempt (with +/-20%
jitter, so thousands of nodes do not reconnect in lock-step) up to
``reconnect_interval_max``.

Possible values:

* A positive number of seconds.

Related options:

* ``reconnect_interval_max``
"""),
    cfg.FloatOpt(
        "reconnect_interval_max",
        default=5.0,
        min=0.01,
        help="""
Longest delay, in seconds, between two reconnection attempts.

Possible values:

* A number of seconds not smaller than ``reconnect_interval``.

Related options:

* ``reconnect_interval``
"""),
    cfg.StrOpt(
        "inprocess_mode",
        default="threaded",
        choices=[
            ("threaded", "Consumers and control servers run in their own "
                         "threads, like in a deployment."),
            ("sync", "Nothing runs until the owner pumps the bus; used by "
                     "the deterministic simulator."),
        ],
        help="""
How the in-process bus delivers messages.

Possible values:

* ``threaded``
* ``sync``

Related options:

* ``backend`` (only for ``inprocess``)
"""),
    cfg.IntOpt(
        "inprocess_max_messages",
        default=0,
        min=0,
        help="""
Retention of the in-process stream by message count.

Possible values:

* 0: no count limit.
* A positive number of messages.

Related options:

* ``inprocess_max_bytes``
"""),
    cfg.IntOpt(
        "inprocess_max_bytes",
        default=256 * 1024 * 1024,
        min=0,
        help="""
Retention of the in-process stream by total body size, in bytes.

Possible values:

* 0: no size limit.
* A positive number of bytes.

Related options:

* ``inprocess_max_messages``
"""),
    cfg.FloatOpt(
        "tail_probe_interval",
        default=5.0,
        min=0.0,
        help="""
Seconds between two looks at the stream's tail by a scheduler (a
short-lived consumer at ``last`` on a connection of its own), from which
its lag is computed: ``shm_stream_tail_offset``, ``shm_stream_lag_offsets``,
``shm_stream_lag_seconds`` and the lag bound of ``/healthz``.

Possible values:

* 0: never look (the lag is then unknown).
* A positive number of seconds.

Related options:

* ``[metrics] max_lag_seconds``
"""),
]

CONTROL_PLANE_OPTS = [
    cfg.StrOpt(
        "backend",
        default="inprocess",
        choices=[
            ("inprocess", "Casts go to inboxes inside this process."),
            ("oslo", "Casts are oslo.messaging RPC casts."),
        ],
        help="""
How control messages travel.

Possible values:

* ``inprocess``: no broker; every party must run in this process.
* ``oslo``: oslo.messaging RPC casts over ``transport_url``.

Related options:

* ``transport_url``, ``executor_thread_pool_size``, ``cast_retry``
* ``[data_plane] backend``
"""),
    cfg.StrOpt(
        "transport_url",
        secret=True,
        help="""
oslo.messaging transport URL of the control plane, for example
``rabbit://shm:secret@rabbit1:5672/``. ``fake://`` is an in-process
oslo.messaging driver for tests (it polls every 50 ms).

Possible values:

* An oslo.messaging transport URL.
* Unset: use ``[DEFAULT] transport_url``.

Related options:

* ``backend`` (only for ``oslo``)
* The ``[oslo_messaging_rabbit]`` options tune the rabbit driver.
"""),
    cfg.StrOpt(
        "reporter_topic",
        default="shm-reporter",
        help="""
Topic on which the reporter of each source (a compute node, the aggregate
catalogue, a foreign service) listens for claims and resync requests; the
server name is the reporter's own name (e.g. the compute host).

Possible values:

* Any RabbitMQ-safe name; identical on all parties.

Related options:

* ``scheduler_topic``
"""),
    cfg.StrOpt(
        "scheduler_topic",
        default="shm-scheduler",
        help="""
Topic on which each scheduler listens for claim results, corrections and
resync answers; the server name is the scheduler's own id.

Possible values:

* Any RabbitMQ-safe name; identical on all parties.

Related options:

* ``reporter_topic``
"""),
    cfg.IntOpt(
        "executor_thread_pool_size",
        default=1,
        min=1,
        help="""
Threads that run the handler of one control server. With 1, casts to one
server are handled one at a time in arrival order; larger pools run
handlers concurrently and reorder them (the handler must then be
thread-safe).

Possible values:

* A positive integer.

Related options:

* ``backend`` (only for ``oslo``)
"""),
    cfg.IntOpt(
        "cast_retry",
        default=3,
        min=-1,
        help="""
How many times one cast retries to reach the broker before it fails
(oslo.messaging ``retry``). Retrying forever blocks the caller for the
whole length of a broker outage.

Possible values:

* -1: retry forever.
* 0: do not retry.
* A positive number of retries.

Related options:

* ``[oslo_messaging_rabbit] rabbit_retry_interval`` and
  ``rabbit_retry_backoff`` set the pause between retries.
"""),
]


#: a cell's own section, ``[data_plane:<cell>]``, for each cell of ``[data_plane] cells``
#: (registered by transport.cells when the cell is listed)
CELL_GROUP_TEMPLATE = cfg.OptGroup(
    "data_plane:<cell>",
    title="A cell's host-state stream",
    help="""
One section per cell listed in ``[data_plane] cells``, named after it (e.g.
``[data_plane:cell1]``): where a scheduler reads that cell's stream,
``<stream_name>.<cell>``. Every setting not given here is ``[data_plane]``'s.
""")

CELL_OPTS = [
    cfg.StrOpt("stream_url", secret=True, help="""
kombu URL of the broker holding this cell's stream, the broker its computes
publish to (their ``[data_plane] stream_url``).

Possible values:

* An ``amqp://`` or ``amqps://`` URL; unset: ``[data_plane] stream_url``.

Related options:

* ``[data_plane] cells``, ``[data_plane] cell``
"""),
    cfg.StrOpt("transport_url", secret=True, help="""
oslo.messaging URL of this cell's broker for the control plane: the resync
requests a scheduler sends to the cell's computes, and their answers, claim
results and fences back to it. The computes of the cell then set it as their
``[control_plane] transport_url`` and talk only to their cell's broker, as
cells v2 has them do.

Possible values:

* A ``rabbit://`` URL; unset: the cell's computes are reached over
  ``[control_plane] transport_url`` (the API level's broker).

Related options:

* ``[control_plane] transport_url``, ``[data_plane:<cell>] stream_url``
"""),
]


def cell_group(cell: str) -> str:
    """The configuration section of ``cell`` (``[data_plane:<cell>]``)."""
    return f"data_plane:{cell}"


def register_cell_groups(conf: cfg.ConfigOpts) -> list[str]:
    """Register the section of each cell listed in ``[data_plane] cells`` (after the files
    were read: which sections exist depends on them); the names as listed, unchecked."""
    try:
        listed = conf.data_plane.cells
    except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
        return []
    names = [c.strip() for c in listed if c.strip()]
    for name in names:
        conf.register_opts(CELL_OPTS, group=cell_group(name))
    return names


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register both groups on *conf* (safe to call more than once).

    Each ConfigOpts gets its own OptGroup object: ``register_group`` only
    shallow-copies the group, so registering the module-level objects on
    two ConfigOpts would share one option table, and an override set on
    one (e.g. one party of the simulator) would leak into the other.
    """
    for template, group_opts in ((DATA_PLANE_GROUP, DATA_PLANE_OPTS),
                                 (CONTROL_PLANE_GROUP, CONTROL_PLANE_OPTS)):
        conf.register_group(cfg.OptGroup(template.name, title=template.title,
                                         help=template.help))
        conf.register_opts(group_opts, group=template.name)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    """Entry point for oslo-config-generator (``shm.transport``): the planes and [signing]."""
    return [
        (DATA_PLANE_GROUP, list(DATA_PLANE_OPTS)),
        (CELL_GROUP_TEMPLATE, list(CELL_OPTS)),
        (CONTROL_PLANE_GROUP, list(CONTROL_PLANE_OPTS)),
        *signing_opts.list_opts(),
    ]
