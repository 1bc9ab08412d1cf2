"""The transport of one simulation run: the in-process bus, or RabbitMQ.

A run owns its stream and topics (named with a fresh suffix) and deletes them
when it ends; scheduler processes of the same run (``--processes``) join it
with the same suffix and ``owner=False``, so only the owner cleans up.

With ``cells`` (``--cells C``, design §4.6) the hosts' reporters publish on C
cell streams, ``<stream>.cell1`` .. ``<stream>.cellC`` (reporter ``k`` in cell
``k % C + 1``), which on this machine stand in for C brokers; the schedulers
read every cell's stream besides the run's own (their entries, checkpoints).
"""

from __future__ import annotations

import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

from simulator.relay import Relay
from transport.base import ControlPlane, DataPlane
from transport.cells import cell_stream_name
from transport.inprocess import InProcessBus, InProcessStreamPlane


class RunTransport:
    """The in-process bus, or RabbitMQ (a kombu stream and oslo.messaging RPC) for one run."""

    def __init__(self, spec: str, suffix: str | None = None, owner: bool = True,
                 cells: int = 0, relay_cell: str | None = None,
                 cell_urls: dict[str, str] | None = None) -> None:
        """``suffix`` names the run's stream and topics (a fresh one by default); another
        process joins the same run with the same suffix and ``owner=False`` (its close()
        then leaves the run's stream and queues to the owner).  ``relay_cell``: that cell's
        stream is reached through a :class:`~simulator.relay.Relay` (:attr:`relay`; RabbitMQ
        only), whose URL the other processes of the run get in :attr:`cell_urls`."""
        self.spec = spec
        self.suffix = suffix = suffix or uuid.uuid4().hex[:8]
        self.owner = owner
        self.topics = (f"shm-sim-reporter-{suffix}", f"shm-sim-scheduler-{suffix}")
        #: the servers' own queues (``<topic>.<server>``), deleted with the stream and topics
        self.queues: list[str] = []
        self.bus: InProcessBus | None = None
        self.data: DataPlane
        self.control: ControlPlane
        #: cell name -> the data plane of its stream (none: one stream)
        self.cell_planes: dict[str, DataPlane] = {}
        names = [f"cell{c + 1}" for c in range(cells)]
        self.relay: Relay | None = None
        #: cell -> the URL its stream is reached at, where it is not the run's broker's
        self.cell_urls: dict[str, str] = dict(cell_urls or {})
        if spec in ("fake", "inprocess"):
            self.bus = InProcessBus(threaded=True)
            self.data = self.control = self.bus
            self.cell_planes = {c: InProcessStreamPlane(
                self.bus, cell_stream_name(self.bus.default_stream, c)) for c in names}
            return
        if not spec.startswith("rabbit://"):
            raise ValueError(f"--transport must be 'fake' or a rabbit:// URL, got {spec!r}")
        from oslo_config import cfg

        from transport import no_eventlet  # noqa: F401  (before oslo_messaging)
        from transport.kombu_stream import KombuStreamDataPlane, StreamSettings
        from transport.oslo_rpc import OsloRpcControlPlane

        conf = cfg.ConfigOpts()
        conf([])
        self.stream = f"shm-sim-{suffix}"
        self.kombu_url = "amqp://" + spec[len("rabbit://"):]
        self.data = KombuStreamDataPlane(StreamSettings(url=self.kombu_url, name=self.stream))
        if relay_cell is not None:
            broker = urlsplit(self.kombu_url)
            self.relay = Relay((broker.hostname or "127.0.0.1", broker.port or 5672))
            self.relay.start()
            netloc = broker.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{self.relay.port}"
            self.cell_urls[relay_cell] = urlunsplit(broker._replace(netloc=netloc))
        self.cell_planes = {c: KombuStreamDataPlane(StreamSettings(
            url=self.cell_urls.get(c, self.kombu_url), name=cell_stream_name(self.stream, c)))
            for c in names}
        self.control = OsloRpcControlPlane(conf, spec)

    def reporter_cell(self, k: int) -> str | None:
        """The cell of reporter ``k``, None without cells."""
        cells = list(self.cell_planes)
        return cells[k % len(cells)] if cells else None

    def reporter_plane(self, k: int) -> DataPlane:
        """The data plane reporter ``k`` publishes on: its cell's stream, or the run's."""
        cell = self.reporter_cell(k)
        return self.data if cell is None else self.cell_planes[cell]

    def stats(self) -> tuple[int, int] | None:
        """(messages, bytes) carried so far on both planes, when the transport counts them."""
        if self.bus is None:
            return None
        s = self.bus.stats()
        return s.stream_messages + s.control_messages, s.stream_bytes + s.control_bytes

    def close(self) -> None:
        if self.bus is not None:
            self.bus.close()
            return
        self.control.close()
        for plane in self.cell_planes.values():
            plane.close()
        if self.relay is not None:
            self.relay.stop()
        self.data.close()
        if not self.owner:
            return
        from kombu import Connection

        try:
            with Connection(self.kombu_url, connect_timeout=5) as conn:
                channel = conn.channel()
                cell_streams = [cell_stream_name(self.stream, c) for c in self.cell_planes]
                for name in (self.stream, *cell_streams, *self.topics, *self.queues):
                    try:
                        channel.queue_delete(queue=name)
                    except Exception:
                        channel = conn.channel()
        except Exception as exc:  # cleanup is best effort; say so
            print(f"warning: could not delete the run's queues: {exc}", file=sys.stderr)
