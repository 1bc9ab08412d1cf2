"""Options of the update log (group ``[update_log]``), read by schedulers and reporters.

An update log records everything a scheduler's host-state cache received and
did (and what a reporter published), so ``shm replay`` can rebuild the cache
record by record and prove invariant 5.  Off by default; ``enabled = true``
and a ``directory`` turn it on.  Each process builds its party's recorder from
:func:`recorder_params`: a scheduler with
:func:`shared_host_manager.updatelog.recorder.from_conf` (``SchedulerService(recorder=...)``),
a reporter with :func:`compute_reporter.recorder.from_conf`
(``ReporterService(recorder=...)``).  Here, below both, so that ``shm reporter``
reads them without importing the scheduler package.

Entry point (``oslo.config.opts``): ``shm.updatelog =
shared_host_manager.conf.updatelog:list_opts`` (which re-exports these).
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

from transport.startup import OperatorError, check_state_dir

GROUP = "update_log"

update_log_opts = [
    cfg.BoolOpt("enabled", default=False, help="""
Record an update log: every message this process received or sent with the
clock value at which it was handled, every timer tick, every claim added and
periodic digests of the whole host-state view. ``shm replay`` rebuilds the
cache from it, checks that it reaches the recorded digests at every checkpoint
(invariant 5), shows any host's state at any point, compares two logs, and
re-runs recorded decisions. Recording costs a few percent of ingest throughput
(bytes are written as received, buffered, without fsync).

Possible values: true, false (default).

Related options: directory, max_file_bytes, max_total_bytes, max_age,
checkpoint_interval.
"""),
    cfg.StrOpt("directory", help="""
Directory of the log files, ``<role>-<name>.ulog.0001``, ``.0002``, ... A
restarted process adds files after the existing ones. Required when enabled;
checked at start (it must be a directory this process can write).

Related options: max_total_bytes, max_age (retention).
"""),
    cfg.IntOpt("max_total_bytes", default=2 * 1024 ** 3, min=0, help="""
Retention by size: when a part is closed, the oldest parts of this process's
log are deleted while all its parts together exceed this many bytes. The part
being written is never deleted, so the log may reach this size plus
max_file_bytes. Every part starts with a base (the views it
holds), so replay starts at the oldest part left. For scale: a scheduler of
750 hosts changing once a second writes about 6 MB a minute. 0: no size
limit.

Related options: max_file_bytes (the unit deleted), max_age.
"""),
    cfg.IntOpt("max_age", default=7 * 24 * 3600, min=0, help="""
Retention by age, in seconds: parts last written longer ago than this are
deleted when a part is closed (never the part being written). 0: no age
limit.

Related options: max_total_bytes.
"""),
    cfg.IntOpt("max_file_bytes", default=256 * 1024 * 1024, min=64 * 1024, help="""
Size in bytes at which the current log file is closed and the next part
(``.0002``, ...) started. Every part begins with a header and a base (the
views held), so each can be read and replayed alone; retention deletes whole
parts.
"""),
    cfg.FloatOpt("checkpoint_interval", default=5.0, min=0.01, help="""
Seconds between checkpoints: every source's view (version, liveness, pending
claims, and the document digest of views that changed) written to the log,
which replay compares with the state it rebuilt. A checkpoint costs about 2
microseconds per changed view plus at most 0.5 % of the interval for document
digests (views left out are digested at a later checkpoint); it holds the
cache lock for that long. Shorter intervals locate a difference more
precisely; measured overhead with 2000 busy hosts: about 3 % of ingest at
0.5 to 5 seconds.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(update_log_opts, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, update_log_opts)]


def check_conf(conf: cfg.ConfigOpts) -> None:
    """What :func:`recorder_params` refuses (OperatorError), without opening a log: a process
    that forks its workers checks this before the fork."""
    group = conf[GROUP]
    if not group.enabled:
        return
    if not group.directory:
        raise OperatorError("[update_log] enabled = true needs [update_log] directory")
    check_state_dir(group.directory, "[update_log] directory")


def recorder_params(conf: cfg.ConfigOpts) -> dict[str, Any] | None:
    """The keyword arguments of a recorder (either party's) if ``[update_log] enabled``, else
    None; checked as :func:`check_conf` does."""
    check_conf(conf)
    group = conf[GROUP]
    if not group.enabled:
        return None
    return dict(directory=group.directory, max_file_bytes=group.max_file_bytes,
                checkpoint_interval=group.checkpoint_interval,
                max_total_bytes=group.max_total_bytes or None, max_age=group.max_age or None)


__all__ = ["GROUP", "check_conf", "list_opts", "recorder_params", "register_opts", "update_log_opts"]
