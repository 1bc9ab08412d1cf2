"""Client side of the reporter's control plane: what a scheduler sends to a compute reporter.

Messages are protocol messages encoded by :mod:`protocol.codec` and cast to
``(topic, reporter name)``; the reporter's endpoints are
:meth:`compute_reporter.manager.ReporterManager.handle`.

Version history (protocol.messages.PROTOCOL_VERSION travels in every message):

* 1.0 – claim (with the build request), resync_request.
"""

from __future__ import annotations

from protocol.codec import Encoder
from protocol.messages import Claim, ResyncRequest
from transport.base import ControlClient

TOPIC = "shm-reporter"


class ReporterAPI:
    def __init__(self, client: ControlClient, encoder: Encoder, topic: str = TOPIC) -> None:
        self._client = client
        self._encoder = encoder
        self.topic = topic

    def claim(self, endpoint: str, claim: Claim) -> None:
        """Send a claim with its build request to the reporter serving ``claim.source``."""
        self._client.cast(self.topic, endpoint, self._encoder.encode(claim))

    def resync(self, endpoint: str, request: ResyncRequest) -> None:
        self._client.cast(self.topic, endpoint, self._encoder.encode(request))
