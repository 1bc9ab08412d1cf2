"""The transport of one simulation run: the in-process bus, or RabbitMQ.

A run owns its stream and topics (named with a fresh suffix) and deletes them
when it ends; scheduler processes of the same run (``--processes``) join it
with the same suffix and ``owner=False``, so only the owner cleans up.
"""

from __future__ import annotations

import sys
import uuid

from transport.base import ControlPlane, DataPlane
from transport.inprocess import InProcessBus


class RunTransport:
    """The in-process bus, or RabbitMQ (a kombu stream and oslo.messaging RPC) for one run."""

    def __init__(self, spec: str, suffix: str | None = None, owner: bool = True) -> None:
        """``suffix`` names the run's stream and topics (a fresh one by default); another
        process joins the same run with the same suffix and ``owner=False`` (its close()
        then leaves the run's stream and queues to the owner)."""
        self.spec = spec
        self.suffix = suffix = suffix or uuid.uuid4().hex[:8]
        self.owner = owner
        self.topics = (f"shm-sim-reporter-{suffix}", f"shm-sim-scheduler-{suffix}")
        #: the servers' own queues (``<topic>.<server>``), deleted with the stream and topics
        self.queues: list[str] = []
        self.bus: InProcessBus | None = None
        self.data: DataPlane
        self.control: ControlPlane
        if spec in ("fake", "inprocess"):
            self.bus = InProcessBus(threaded=True)
            self.data = self.control = self.bus
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
        self.control = OsloRpcControlPlane(conf, spec)

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
        self.data.close()
        if not self.owner:
            return
        from kombu import Connection

        try:
            with Connection(self.kombu_url, connect_timeout=5) as conn:
                channel = conn.channel()
                for name in (self.stream, *self.topics, *self.queues):
                    try:
                        channel.queue_delete(queue=name)
                    except Exception:
                        channel = conn.channel()
        except Exception as exc:  # cleanup is best effort; say so
            print(f"warning: could not delete the run's queues: {exc}", file=sys.stderr)
