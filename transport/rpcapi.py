"""Client side of the control plane: what a scheduler casts to a reporter, and back.

The data plane (the stream) is broadcast and needs no client; the control
plane is point to point, over oslo.messaging RPC casts (see
:mod:`transport.oslo_rpc`) or the in-process bus.  Every cast carries one
protocol message encoded by :mod:`protocol.codec` and goes to ``(topic,
server)``, where the server is the receiving party's own name:

* :class:`ReporterAPI` casts to ``(reporter topic, reporter name)``; the
  endpoint is :meth:`compute_reporter.manager.ReporterManager.handle`.
* :class:`SchedulerAPI` casts to ``(scheduler topic, scheduler name)``; the
  endpoint is :meth:`shared_host_manager.cache.HostStateCache.ingest_control`.
  Reporters answer through it.  A scheduler announces its claims to its live
  peers through one on the topic :func:`peer_topic` (a fanout cast to every
  ``(scheduler topic + "-peers", peer name)``; endpoint
  :meth:`shared_host_manager.cache.HostStateCache.ingest_peer_claim`), so that
  an announcement never waits behind the claim results of the main topic; the
  requests schedulers hand to each other, and the answers, go to a peer by name
  on the same topic (:meth:`SchedulerAPI.hand`).

Both clients live here, below the reporter and the scheduler packages, so
neither side imports the other (docs/design.md §7, the wire).

Version history (one for the whole control plane; ``protocol.messages.PROTOCOL_VERSION``
travels in every message, so a receiver can refuse what it does not speak):

* 1.0 – scheduler -> reporter: claim (with its build request), resync_request;
  reporter -> scheduler: claim_result (accepted, or rejected with a
  correction), resync_answer.
* 1.1 – scheduler -> scheduler: claim, as sent to its reporter but without the
  build request, fanned out to the schedulers on the peer topic (``[cache]
  announce_claims``), and the host's claim_result rejecting it, forwarded as
  received; a scheduler that predates it has no server there.
* 1.2 – scheduler -> scheduler on the scheduler topic: scarce_request (a scarce
  request handed to the live peers' coordinator, ``[filter_scheduler]
  scarce_coordinator``, or a request whose best hosts are all its receiver's,
  ``[filter_scheduler] hand_to_owner``; the same message either way) and
  scarce_answer (what became of it); a scheduler that predates it drops both as
  unknown, and the one that handed the request over times out.
* 1.3 – source -> every scheduler, fanned out on the scheduler topic: fence (a change
  at (epoch, seq) is on the stream; decide only once it is applied), sent by the API-side
  source after a service change an API call waits for; a scheduler that predates it drops
  it as unknown and decides as before, within its staleness.
* 1.4 – scarce_request and scarce_answer travel on the peer topic (cast to the receiving
  scheduler by name) instead of the scheduler topic: over RabbitMQ kombu alone carries
  them, as it carries the announcements (``transport.kombu_peers``), where each cast
  through oslo.messaging's listener cost milliseconds of CPU and tens of milliseconds of
  latency on a request waiting for its answer.  One route per kind: a scheduler drops a
  scarce message on the scheduler topic as on the wrong plane, and a 1.2/1.3 scheduler
  never hears one on the peer topic; while both run, a request handed between them times
  out (turn ``scarce_coordinator`` and ``hand_to_owner`` off for that window).
* 1.5 – scheduler -> every scheduler, fanned out on the peer topic: checkpoint_ask (a
  scheduler starting without a state file asks for a checkpoint now; the one that publishes
  checkpoints answers on the checkpoint stream, design §4.5); a scheduler that predates it
  drops it as unknown, and the newcomer restores the newest periodic checkpoint after its
  wait.
"""

from __future__ import annotations

import dataclasses

from protocol.codec import Encoder
from protocol.messages import (
    ANNOUNCED_KEYS,
    CheckpointAsk,
    Claim,
    ClaimResult,
    Fence,
    ResyncAnswer,
    ResyncRequest,
    ScarceAnswer,
    ScarceRequest,
)
from transport.base import ControlClient

#: default topics (``[control_plane] reporter_topic`` / ``scheduler_topic``)
REPORTER_TOPIC = "shm-reporter"
SCHEDULER_TOPIC = "shm-scheduler"


def peer_topic(scheduler_topic: str) -> str:
    """The topic schedulers announce their claims to each other on."""
    return f"{scheduler_topic}-peers"


class ReporterAPI:
    """What a scheduler sends to the reporter serving a source."""

    def __init__(self, client: ControlClient, encoder: Encoder, topic: str = REPORTER_TOPIC) -> None:
        self._client = client
        self._encoder = encoder
        self.topic = topic

    def claim(self, endpoint: str, claim: Claim) -> None:
        """Send a claim with its build request to the reporter serving ``claim.source``."""
        self._client.cast(self.topic, endpoint, self._encoder.encode(claim))

    def resync(self, endpoint: str, request: ResyncRequest) -> None:
        self._client.cast(self.topic, endpoint, self._encoder.encode(request))


class SchedulerAPI:
    """What a reporter sends back to the scheduler that asked."""

    def __init__(self, client: ControlClient, encoder: Encoder, topic: str = SCHEDULER_TOPIC) -> None:
        self._client = client
        self._encoder = encoder
        self.topic = topic

    def send(self, scheduler: str, message: ClaimResult | ResyncAnswer) -> None:
        self._client.cast(self.topic, scheduler, self._encoder.encode(message))

    def hand(self, scheduler: str, message: ScarceRequest | ScarceAnswer) -> None:
        """Cast a request handed over, or the answer to one, to ``scheduler`` (on the peer
        topic since 1.4)."""
        self._client.cast(self.topic, scheduler, self._encoder.encode(message))

    def announce(self, claim: Claim, to: str | None = None) -> None:
        """Fan ``claim`` (a scheduler's own, its build request left out but for its
        ``ANNOUNCED_KEYS``) out to every scheduler listening on this topic: one publish,
        whatever their number; or, ``to`` named, cast it to that scheduler alone."""
        request = {k: claim.request[k] for k in ANNOUNCED_KEYS if k in claim.request}
        self._peer_cast(self._encoder.encode(dataclasses.replace(claim, request=request)), to)

    def forward(self, body: bytes, to: str | None = None) -> None:
        """Fan a message out as received (a host's signed rejection of one of our claims);
        or, ``to`` named, cast it to that scheduler alone."""
        self._peer_cast(body, to)

    def _peer_cast(self, body: bytes, to: str | None) -> None:
        if to is None:
            self._client.fanout(self.topic, body)
        else:
            self._client.cast(self.topic, to, body)

    def ask_checkpoint(self, ask: CheckpointAsk) -> None:
        """Fan ``ask`` out to every scheduler on this topic (the peer topic): whichever
        publishes checkpoints answers on the checkpoint stream."""
        self._client.fanout(self.topic, self._encoder.encode(ask))

    def fence(self, fence: Fence) -> None:
        """Fan ``fence`` out to every scheduler on this topic (a source whose caller waits for
        its change to be decided on: every scheduler, not only the one that asked)."""
        self._client.fanout(self.topic, self._encoder.encode(fence))


__all__ = ["REPORTER_TOPIC", "SCHEDULER_TOPIC", "ReporterAPI", "SchedulerAPI", "peer_topic"]
