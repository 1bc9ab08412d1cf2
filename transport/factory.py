"""Build the data and control planes a process uses from its configuration.

Role: read ``[data_plane]`` and ``[control_plane]`` (``transport.opts``)
and construct the matching backends: ``InProcessBus``,
``KombuStreamDataPlane`` or ``OsloRpcControlPlane``. Broker libraries are
imported only when their backend is chosen, so the embedded mode never
loads oslo.messaging.

Two ways in, differing only in who owns the in-process bus:

* ``from_conf(conf)`` returns ``(data_plane, control_plane)``. In-process
  planes are the *process-wide default bus* (``default_bus()``), so every
  party of the embedded mode built this way sees the others. That bus
  lives until ``close_default_bus()`` (or process exit); broker-backed
  planes are the caller's to ``close()``.
* ``build_transports(conf, bus=None)`` returns a ``Transports`` that owns
  what it built, including a private bus unless one is handed in; the
  caller stops its parties and then calls ``Transports.close()``.

``topics(conf)`` gives the control-plane topic names every party uses.

Cells (``transport.cells``, docs/design.md §4.6): a publisher with ``[data_plane]
cell`` gets that cell's stream from ``build_data_plane``; a scheduler gets every
listed cell's stream, besides the deployment's, from ``build_cell_planes``, and the
control plane on each cell broker it reaches the cell's computes on from
``build_cell_control_planes``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, NamedTuple

from oslo_config import cfg

from transport import cells as cells_conf
from transport import opts
from transport.base import ControlPlane, DataPlane
from transport.inprocess import InProcessBus, InProcessStreamPlane
from transport.startup import OperatorError

if TYPE_CHECKING:
    from transport.kombu_stream import StreamSettings

__all__ = [
    "Topics",
    "Transports",
    "build_cell_control_planes",
    "build_cell_planes",
    "build_control_plane",
    "build_data_plane",
    "build_inprocess_bus",
    "build_transports",
    "close_default_bus",
    "default_bus",
    "from_conf",
    "stream_settings",
    "topics",
]

_default_lock = threading.Lock()
_default: InProcessBus | None = None


class Topics(NamedTuple):
    """Control-plane topics: reporters listen on ``reporter`` (server =
    reporter name), schedulers on ``scheduler`` (server = scheduler id)."""

    reporter: str
    scheduler: str


def topics(conf: cfg.ConfigOpts) -> Topics:
    opts.register_opts(conf)
    cp = conf.control_plane
    return Topics(reporter=cp.reporter_topic, scheduler=cp.scheduler_topic)


@dataclasses.dataclass
class Transports:
    """The two planes of one process (and the bus they may share).

    ``owns_bus`` is False when the bus was handed in by the caller: other
    parties may still be using it, so ``close()`` leaves it running.
    """

    data: DataPlane
    control: ControlPlane
    bus: InProcessBus | None = None
    owns_bus: bool = False

    def close(self) -> None:
        """Close the control plane, then the data plane, then the bus."""
        for plane in (self.control, self.data):
            if plane is not self.bus:
                plane.close()
        if self.bus is not None and self.owns_bus:
            self.bus.close()


def build_inprocess_bus(conf: cfg.ConfigOpts) -> InProcessBus:
    opts.register_opts(conf)
    dp = conf.data_plane
    return InProcessBus(
        threaded=dp.inprocess_mode == "threaded",
        stream=dp.stream_name,
        max_messages=dp.inprocess_max_messages or None,
        max_bytes=dp.inprocess_max_bytes or None,
    )


def default_bus(conf: cfg.ConfigOpts) -> InProcessBus:
    """The process-wide in-process bus, created from *conf* on first use.

    Later calls return the same bus whatever their *conf* says: there is
    one embedded "broker" per process, as there is one RabbitMQ per
    deployment.
    """
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = build_inprocess_bus(conf)
        return _default


def close_default_bus() -> None:
    """Stop the process-wide bus (its parties stop receiving)."""
    global _default
    with _default_lock:
        bus, _default = _default, None
    if bus is not None:
        bus.close()


def from_conf(conf: cfg.ConfigOpts, bus: InProcessBus | None = None, *,
              cell: str | None = None) -> tuple[DataPlane, ControlPlane]:
    """``(data_plane, control_plane)`` for *conf*, the data plane on ``cell``'s stream if
    given; in-process planes use *bus* or else the process-wide ``default_bus(conf)``."""
    opts.register_opts(conf)
    if bus is None and "inprocess" in (conf.data_plane.backend,
                                       conf.control_plane.backend):
        bus = default_bus(conf)
    return build_data_plane(conf, bus, cell=cell), build_control_plane(conf, bus)


def stream_settings(conf: cfg.ConfigOpts, *, url: str | None = None,
                    name: str | None = None) -> StreamSettings:
    """``StreamSettings`` for the RabbitMQ stream from ``[data_plane]``: its ``stream_url``
    and ``stream_name`` unless ``url`` / ``name`` are given (a cell's stream)."""
    from transport.kombu_stream import StreamSettings

    opts.register_opts(conf)
    dp = conf.data_plane
    url = url or dp.stream_url
    if not url:
        raise OperatorError("[data_plane] stream_url is required with backend = rabbit: set the "
                            "broker's URL, e.g. amqp://USER:PASSWORD@HOST:5672//")
    return StreamSettings(
        url=url,
        name=name or dp.stream_name,
        max_age=dp.stream_max_age or None,
        max_length_bytes=dp.stream_max_length_bytes or None,
        max_segment_size_bytes=dp.stream_max_segment_size_bytes or None,
        prefetch_count=dp.prefetch_count,
        publisher_confirms=dp.publisher_confirms,
        publish_timeout=dp.publish_timeout,
        connect_timeout=dp.connect_timeout,
        heartbeat=dp.heartbeat,
        reconnect_interval=dp.reconnect_interval,
        reconnect_interval_max=max(dp.reconnect_interval,
                                   dp.reconnect_interval_max),
        tail_probe_interval=dp.tail_probe_interval,
    )


def build_data_plane(conf: cfg.ConfigOpts, bus: InProcessBus | None = None, *,
                     cell: str | None = None) -> DataPlane:
    """The data plane chosen by ``[data_plane] backend``: the deployment's stream, or the
    stream of ``cell`` (on ``stream_url``'s broker, or the URL given for it).

    For ``inprocess`` the given *bus* is used, or a new one is created.
    """
    opts.register_opts(conf)
    name = cells_conf.cell_stream_name(conf.data_plane.stream_name, cell) if cell else None
    if conf.data_plane.backend == "inprocess":
        bus = bus if bus is not None else build_inprocess_bus(conf)
        return InProcessStreamPlane(bus, name) if name else bus
    from transport.kombu_stream import KombuStreamDataPlane

    url = cells_conf.cell_urls(conf).get(cell) if cell else None
    return KombuStreamDataPlane(stream_settings(conf, url=url, name=name))


def build_cell_planes(conf: cfg.ConfigOpts,
                      bus: InProcessBus | None = None) -> dict[str, DataPlane]:
    """Each cell a scheduler reads (``[data_plane] cells``) -> the data plane of its stream,
    in the listed order; {} for one stream.  In-process cells share *bus* (or the
    process-wide one)."""
    opts.register_opts(conf)
    names = cells_conf.cells(conf)
    if names and conf.data_plane.backend == "inprocess" and bus is None:
        bus = default_bus(conf)
    return {cell: build_data_plane(conf, bus, cell=cell) for cell in names}


def build_control_plane(conf: cfg.ConfigOpts,
                        bus: InProcessBus | None = None, *,
                        url: str | None = None) -> ControlPlane:
    """The control plane chosen by ``[control_plane] backend``, on ``[control_plane]
    transport_url``'s broker or the one ``url`` names (a cell's)."""
    opts.register_opts(conf)
    cp = conf.control_plane
    if cp.backend == "inprocess":
        return bus if bus is not None else build_inprocess_bus(conf)
    if url is None:
        _require_transport_url(conf)
    from transport.oslo_rpc import OsloRpcControlPlane

    return OsloRpcControlPlane(
        conf, url or cp.transport_url,
        pool_size=cp.executor_thread_pool_size,
        cast_retry=None if cp.cast_retry < 0 else cp.cast_retry,
    )


def build_cell_control_planes(conf: cfg.ConfigOpts) -> dict[str, ControlPlane]:
    """Each read cell whose computes are reached on its own broker (``[data_plane:<cell>]
    transport_url``) -> the control plane on that broker; {} in-process, where every party
    shares one bus."""
    opts.register_opts(conf)
    if conf.control_plane.backend == "inprocess":
        return {}
    return {cell: build_control_plane(conf, url=url)
            for cell, url in cells_conf.cell_control_urls(conf).items()}


def check_urls(conf: cfg.ConfigOpts) -> None:
    """The OperatorError :func:`from_conf` raises for a missing broker URL, without building
    a plane (nova-scheduler-shared checks before nova forks its workers, which build them)."""
    opts.register_opts(conf)
    cells_conf.publish_cell(conf)
    cells_conf.cells(conf)
    if conf.data_plane.backend == "rabbit":
        stream_settings(conf)
        for cell, url in cells_conf.cell_urls(conf).items():
            stream_settings(conf, url=url,
                            name=cells_conf.cell_stream_name(conf.data_plane.stream_name, cell))
    if conf.control_plane.backend == "oslo":
        _require_transport_url(conf)


def _require_transport_url(conf: cfg.ConfigOpts) -> None:
    if not conf.control_plane.transport_url and not _default_transport_url(conf):
        # oslo.messaging would silently use rabbit://guest:guest@localhost
        raise OperatorError("[control_plane] transport_url is required with backend = oslo: set "
                            "the broker's URL, e.g. rabbit://USER:PASSWORD@HOST:5672/")


def _default_transport_url(conf: cfg.ConfigOpts) -> str | None:
    """``[DEFAULT] transport_url`` if this ConfigOpts has it (oslo.messaging registers it)."""
    try:
        url: str | None = conf.transport_url
        return url
    except cfg.NoSuchOptError:
        return None


def build_transports(conf: cfg.ConfigOpts,
                     bus: InProcessBus | None = None) -> Transports:
    """Both planes; in-process planes share one bus (*bus* or a new one)."""
    opts.register_opts(conf)
    uses_bus = "inprocess" in (conf.data_plane.backend,
                               conf.control_plane.backend)
    owns_bus = uses_bus and bus is None
    if owns_bus:
        bus = build_inprocess_bus(conf)
    data = build_data_plane(conf, bus)
    control = build_control_plane(conf, bus)
    return Transports(data=data, control=control,
                      bus=bus if uses_bus else None, owns_bus=owns_bus)
