"""The control plane over oslo.messaging RPC casts.

Role: carry opaque control bodies (claims, claim results, resync requests
and answers) point to point: ``ControlClient.cast(topic, server, body)``
reaches the one ``ControlServer`` listening as ``Target(topic, server)``
(RabbitMQ queue ``<topic>.<server>``). oslo.messaging cannot carry raw
bytes (its JSON envelope fails on non-UTF-8; docs/design.md §7.2), so bodies
travel base64-encoded as the ``body`` argument of the endpoint method
``deliver``, in namespace ``shm.transport`` version 1.0.

Life cycle: ``OsloRpcControlPlane`` owns one oslo.messaging RPC transport
(its connection pool), built from a ``ConfigOpts`` and a transport URL
(``rabbit://...`` in a deployment, ``fake://`` in tests). Servers and
clients built from it share that transport. A server receives between
``start()`` and ``stop()``; ``stop()`` is oslo's ``stop()`` followed by
``wait()``, so it returns once the handler has finished. ``close()`` on
the plane stops leftover servers and then releases the transport.

Delivery is at most once: oslo.messaging acks an RPC message when it is
received, before dispatch, and a message received between ``stop()`` and
the end of ``wait()`` is acked but not dispatched (docs/design.md §7.2). A
cast to a target that has never had a server is dropped by the broker.
The protocol copes through claim deadlines and resync requests; do not
use this plane for anything that needs guaranteed delivery.

The contract: docs/design.md §7.2.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import weakref
from typing import Any

from transport import no_eventlet  # noqa: F401  (must precede oslo_messaging)

# isort: split

import oslo_messaging
from oslo_config import cfg

from transport.base import CastError, ControlHandler

try:  # private modules of oslo.messaging 18.x; absent in older releases
    from oslo_messaging._metrics import client as om_metrics
    from oslo_messaging._tracing import client as om_tracing
except ImportError:  # pragma: no cover - depends on the installed release
    om_metrics = om_tracing = None

__all__ = [
    "NAMESPACE",
    "VERSION",
    "OsloControlClient",
    "OsloControlServer",
    "OsloRpcControlPlane",
    "prepare_conf",
]

LOG = logging.getLogger(__name__)


class _CancelDuringCloseFilter(logging.Filter):
    """Quiets one py-amqp warning that every clean shutdown produced.

    When an RPC server stops, oslo.messaging closes its channel and RabbitMQ,
    deleting the server's auto-delete queue, tells the consumer so with a
    ``basic.cancel`` (method (60, 30)) that crosses the close; py-amqp then
    logs "Received method (60, 30) during closing channel N" at WARNING.  It
    is expected and harmless: logged at DEBUG instead.  Any other method
    received during a close stays a warning.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno == logging.WARNING and "during closing channel" in str(record.msg)
                and record.args and isinstance(record.args, tuple) and record.args[0] == (60, 30)):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("amqp").isEnabledFor(logging.DEBUG)
        return True


_amqp_log = logging.getLogger("amqp")
if not any(isinstance(f, _CancelDuringCloseFilter) for f in _amqp_log.filters):
    _amqp_log.addFilter(_CancelDuringCloseFilter())

NAMESPACE = "shm.transport"
VERSION = "1.0"
_METHOD = "deliver"


def prepare_conf(conf: cfg.ConfigOpts) -> cfg.ConfigOpts:
    """Make a (possibly private) ``ConfigOpts`` usable by oslo.messaging.

    oslo.messaging 18.x registers its ``[oslo_messaging_tracing]`` and
    ``[oslo_messaging_metrics]`` options only on the global ``cfg.CONF``;
    with any other ConfigOpts the first ``cast()`` raises
    ``NoSuchOptError``. Registering the library's own
    option objects is idempotent, so this is safe on ``cfg.CONF`` too.
    """
    if om_tracing is not None:
        conf.register_opts(om_tracing.oslo_messaging_tracing,
                           group="oslo_messaging_tracing")
    if om_metrics is not None:
        conf.register_opts(om_metrics.oslo_messaging_metrics,
                           group="oslo_messaging_metrics")
    return conf


class _Endpoint:
    """The one RPC method the control plane exposes."""

    target = oslo_messaging.Target(namespace=NAMESPACE, version=VERSION)

    def __init__(self, label: str, handler: ControlHandler) -> None:
        self._label = label
        self._handler = handler
        self.delivered = 0
        self.errors = 0

    def deliver(self, ctxt: dict[str, Any], body: str) -> None:
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, TypeError, ValueError):
            self.errors += 1
            LOG.warning("control %s: dropped a cast whose body is not "
                        "base64", self._label)
            return
        self.delivered += 1
        try:
            self._handler(raw)
        except Exception:
            # Logged here with context, so oslo does not log a second,
            # context-free traceback for the same failure.
            self.errors += 1
            LOG.exception("control %s: handler failed; cast dropped",
                          self._label)


class OsloControlServer:
    """Receives casts for ``(topic, server)`` on an oslo.messaging RPC
    server with the threading executor."""

    def __init__(self, plane: OsloRpcControlPlane, topic: str, server: str,
                 handler: ControlHandler) -> None:
        self.topic = topic
        self.server = server
        self._plane = plane
        self._endpoint = _Endpoint(f"{topic}.{server}", handler)
        self._rpc: Any = None
        self._lock = threading.Lock()

    @property
    def delivered(self) -> int:
        return self._endpoint.delivered

    @property
    def errors(self) -> int:
        return self._endpoint.errors

    def start(self) -> None:
        with self._lock:
            if self._rpc is not None:
                raise RuntimeError("control server already started")
            rpc = oslo_messaging.get_rpc_server(
                self._plane.transport,
                oslo_messaging.Target(topic=self.topic, server=self.server),
                [self._endpoint])
            if rpc.executor_type != "threading":
                raise RuntimeError(
                    f"oslo.messaging chose the {rpc.executor_type!r} "
                    "executor; this project only runs on threads")
            rpc.start(override_pool_size=self._plane.pool_size)
            self._rpc = rpc

    def stop(self) -> None:
        with self._lock:
            rpc, self._rpc = self._rpc, None
        if rpc is None:
            return
        rpc.stop()
        rpc.wait()


class OsloControlClient:
    """Casts base64 bodies to ``(topic, server)`` targets."""

    def __init__(self, plane: OsloRpcControlPlane) -> None:
        self._plane = plane
        self._client = oslo_messaging.get_rpc_client(
            plane.transport,
            oslo_messaging.Target(namespace=NAMESPACE, version=VERSION))
        self._closed = False
        self.casts = 0
        self.cast_bytes = 0

    def cast(self, topic: str, server: str, body: bytes) -> None:
        self._send(body, f"cast to {topic}.{server}", topic=topic, server=server)

    def fanout(self, topic: str, body: bytes) -> None:
        """One publish to the topic's fanout exchange, which every RPC server of the topic
        consumes from."""
        self._send(body, f"fanout cast to {topic}", topic=topic, fanout=True)

    def _send(self, body: bytes, what: str, **target: Any) -> None:
        if self._closed:
            raise CastError("control client is closed")
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"cast body must be bytes, got {type(body).__name__}")
        encoded = base64.b64encode(body).decode("ascii")
        try:
            self._client.prepare(retry=self._plane.cast_retry, **target).cast(
                {}, _METHOD, body=encoded)
        except oslo_messaging.MessagingException as exc:
            raise CastError(f"{what} failed: {exc}") from exc
        self.casts += 1
        self.cast_bytes += len(body)

    def close(self) -> None:
        # The transport is the plane's; the client holds nothing else.
        self._closed = True


class OsloRpcControlPlane:
    """``ControlPlane`` factory over one oslo.messaging RPC transport.

    :param conf: the service's ConfigOpts (may be private); oslo.messaging
        reads its driver options (``[oslo_messaging_rabbit]``...) from it.
    :param url: transport URL, e.g. ``rabbit://user:pw@host:5672/`` or
        ``fake://``. None uses ``[DEFAULT] transport_url`` of *conf*.
    :param pool_size: handler threads per server. 1 keeps casts to one
        server in arrival order (a pool of 64 threads reorders them).
    :param cast_retry: connection retries per cast (None: forever, which
        can block a caller for the whole broker outage).
    """

    def __init__(self, conf: cfg.ConfigOpts, url: str | None = None, *,
                 pool_size: int = 1, cast_retry: int | None = 3) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        self.conf = prepare_conf(conf)
        self.url = url
        self.pool_size = pool_size
        self.cast_retry = cast_retry
        self.driver = oslo_messaging.TransportURL.parse(conf, url).transport
        self.transport = oslo_messaging.get_rpc_transport(conf, url=url)
        self._servers: weakref.WeakSet[OsloControlServer] = weakref.WeakSet()
        self._closed = False

    def control_server(self, topic: str, server: str,
                       handler: ControlHandler) -> OsloControlServer:
        srv = OsloControlServer(self, topic, server, handler)
        self._servers.add(srv)
        return srv

    def control_client(self) -> OsloControlClient:
        return OsloControlClient(self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for srv in list(self._servers):
            srv.stop()
        if self.driver == "fake":
            # The fake driver's cleanup() empties a class-level table
            # shared by every fake transport in the process, which would
            # drop other parties' undelivered casts.
            return
        self.transport.cleanup()
