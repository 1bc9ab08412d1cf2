"""Client side of the scheduler's control plane: what a compute reporter sends to a scheduler.

Casts to ``(topic, scheduler name)``; the scheduler's endpoint is
:meth:`shared_host_manager.cache.HostStateCache.ingest_control`.

Version history (protocol.messages.PROTOCOL_VERSION travels in every message):

* 1.0 – claim_result (accepted, or rejected with a correction), resync_answer.
"""

from __future__ import annotations

from protocol.codec import Encoder
from protocol.messages import ClaimResult, ResyncAnswer
from transport.base import ControlClient

TOPIC = "shm-scheduler"


class SchedulerAPI:
    def __init__(self, client: ControlClient, encoder: Encoder, topic: str = TOPIC) -> None:
        self._client = client
        self._encoder = encoder
        self.topic = topic

    def send(self, scheduler: str, message: ClaimResult | ResyncAnswer) -> None:
        self._client.cast(self.topic, scheduler, self._encoder.encode(message))
