"""I/O edges of the host-state synchronizer: move opaque message bytes.

Role: carry bodies encoded elsewhere (``protocol``) between sources and
schedulers over two planes: a replayable *data plane* stream and a
point-to-point *control plane*. Backends: ``transport.inprocess`` (no
broker), ``transport.kombu_stream`` (RabbitMQ stream) and
``transport.oslo_rpc`` (oslo.messaging casts); ``transport.factory``
builds them from ``transport.opts``.

Life cycle: importing this package opens nothing and loads no broker
library; see ``transport.base`` for the life cycle of each object.
"""

from transport.base import (
    CastError,
    ControlClient,
    ControlHandler,
    ControlPlane,
    ControlServer,
    DataPlane,
    OffsetSpec,
    OnMessage,
    OnRetentionGap,
    PublishError,
    StreamConsumer,
    StreamPublisher,
    TransportError,
)

__all__ = [
    "CastError",
    "ControlClient",
    "ControlHandler",
    "ControlPlane",
    "ControlServer",
    "DataPlane",
    "OffsetSpec",
    "OnMessage",
    "OnRetentionGap",
    "PublishError",
    "StreamConsumer",
    "StreamPublisher",
    "TransportError",
]
