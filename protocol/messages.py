"""Message types of the host-state protocol (protocol version 1).

Data plane (broadcast on the stream, read by every scheduler):

* :class:`Snapshot` – a source's whole document at (epoch, seq).
* :class:`Delta` – the ops that turn (epoch, seq-1) into (epoch, seq), and the
  ids of the claims whose consumption those ops include.
* :class:`Heartbeat` – (epoch, seq) and the digest of the document there.
* :class:`Batch` – many of the three above, of any sources, in one message.

Control plane (point to point):

* :class:`ResyncRequest` – scheduler -> source: "I hold (epoch, seq); send me what I miss".
* :class:`ResyncAnswer` – source -> scheduler: deltas from the ring buffer, or a snapshot.
* :class:`Claim` – scheduler -> source, with the build request.
* :class:`ClaimResult` – source -> scheduler: accepted, or rejected with a
  reason and a correction (what the scheduler had not seen).
* :class:`CheckpointAsk` – a starting scheduler -> every scheduler: "publish a checkpoint
  now, naming my token".
* :class:`Fence` – source -> every scheduler: "my change at (epoch, seq) is on
  the stream; decide only once you hold it" (a service forced down by an API
  call that has returned must not receive the next build).

Versions: ``epoch`` is a totally ordered integer that changes when a source may
have lost its past; ``seq`` starts at 0 in each epoch and grows by one per
delta.  :data:`NO_EPOCH` / seq 0 in a resync request means "I hold nothing".

The classes are plain data; :mod:`protocol.codec` turns them into bytes and
back, validating everything that comes from the wire.  They are ``final``: the
codec and the machines dispatch on the exact type (``type(m) is Delta``), which
is also what lets a type checker narrow a :data:`Message` in those branches.

The contract: docs/design.md §3; the fields: docs/protocol.md §3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, final

from protocol.document import Document, Op
from protocol.groups import ClaimGroup

PROTOCOL_VERSION = 1
NO_EPOCH = -1


@final
@dataclass(slots=True)
class Snapshot:
    source: str
    epoch: int
    seq: int
    doc: Document
    #: ids of recently accepted claims whose consumption ``doc`` includes
    claims: list[str] = field(default_factory=list)

    TYPE = "snapshot"


@final
@dataclass(slots=True)
class Delta:
    source: str
    epoch: int
    seq: int
    ops: list[Op]
    claims: list[str] = field(default_factory=list)

    TYPE = "delta"


@final
@dataclass(slots=True)
class Heartbeat:
    source: str
    epoch: int
    seq: int
    digest: bytes

    TYPE = "heartbeat"


DataItem = Snapshot | Delta | Heartbeat


@final
@dataclass(slots=True)
class Batch:
    items: list[DataItem]
    #: control-plane address of the publisher, which answers resyncs and claims
    #: for the sources in ``items`` (lets a scheduler reach a source it does not
    #: hold yet); empty when unknown
    origin: str = ""

    TYPE = "batch"


@final
@dataclass(slots=True)
class ResyncRequest:
    source: str
    requester: str
    epoch: int
    seq: int
    #: ask for a snapshot even if deltas would do (used after a digest mismatch)
    full: bool = False

    TYPE = "resync_request"


@final
@dataclass(slots=True)
class ResyncAnswer:
    source: str
    requester: str
    items: list[Snapshot | Delta]

    TYPE = "resync_answer"


#: the keys of a claim's ``request`` its announcement to the peers carries (the rest, the
#: build request, goes to the arbiter alone), set by the nova drop-in, whose arbiter is
#: placement (design §11): the allocation request placement is asked for,
#: ``{rp_uuid: {resource_class: amount}}``, which the peers' placement views deduct, and
#: True on the announcement of a claim placement accepted (absent on an intent)
ANNOUNCED_ALLOCATIONS = "placement_allocations"
ANNOUNCED_ACCEPTED = "placement_accepted"
ANNOUNCED_KEYS = (ANNOUNCED_ALLOCATIONS, ANNOUNCED_ACCEPTED)


@final
@dataclass(slots=True)
class Claim:
    claim_id: str
    scheduler: str
    source: str
    #: the version of the source's document the decision was based on
    epoch: int
    seq: int
    resources: dict[str, int]
    #: the instance this claim is for; accepted claims add it to ``instances``
    instance: str = ""
    #: the build request travelling with the claim (JSON-like, opaque to the arbiter)
    request: dict[str, Any] = field(default_factory=dict)
    #: the instance's server group, whose policy the arbiter checks (protocol.groups)
    group: ClaimGroup | None = None

    TYPE = "claim"


@final
@dataclass(slots=True)
class ClaimResult:
    claim_id: str
    scheduler: str
    source: str
    accepted: bool
    #: accepted: the version whose delta lists the claim; rejected: the version judged
    epoch: int
    seq: int
    reason: str = ""
    #: rejected: what the scheduler missed, oldest first (deltas or one snapshot)
    correction: list[Snapshot | Delta] = field(default_factory=list)

    TYPE = "claim_result"


@final
@dataclass(slots=True)
class ScarceRequest:
    """A scarce request handed by a scheduler to the live peers' coordinator, which decides
    and claims it in its stead (design §5.4); scheduler to scheduler."""

    request_id: str
    #: the scheduler handing it over (the speaker)
    scheduler: str
    coordinator: str
    #: the request spec as plain data (shared_host_manager.decision.request.spec_to_wire)
    spec: dict[str, Any]

    TYPE = "scarce_request"


@final
@dataclass(slots=True)
class ScarceAnswer:
    """What became of a :class:`ScarceRequest`, from the coordinator back to the scheduler
    that handed it over, once every instance is placed or has failed."""

    request_id: str
    #: the coordinator (the speaker)
    scheduler: str
    requester: str
    #: instance -> the source it was placed on
    placed: dict[str, str] = field(default_factory=dict)
    #: instance -> why it could not be placed
    failed: dict[str, str] = field(default_factory=dict)
    claims: int = 0
    rejected: int = 0

    TYPE = "scarce_answer"


@final
@dataclass(slots=True)
class Fence:
    """Source -> every scheduler, on the control plane, after the stream confirmed a change the
    source's caller must see decided on (read-your-writes, design §2): a scheduler holds its
    next decision until it has applied ``source`` at (epoch, seq) or later, waiting at most
    ``[cache] fence_timeout``.  Not host state: the receiver never sees it."""

    source: str
    epoch: int
    seq: int

    TYPE = "fence"


@final
@dataclass(slots=True)
class CheckpointAsk:
    """A scheduler starting without a state file, fanned out to its peers on the peer topic:
    "publish a checkpoint now" (design §4.5).  The scheduler that publishes checkpoints takes
    one at once and names ``token`` in it, so that the newcomer restores a view seconds
    younger than the newest periodic one and has that much less of the stream to replay.
    Not host state: the receiver never sees it."""

    #: the newcomer (the speaker)
    scheduler: str
    #: unique per start of the newcomer: the answer names it
    token: str

    TYPE = "checkpoint_ask"


Message = (
    Snapshot | Delta | Heartbeat | Batch | ResyncRequest | ResyncAnswer | Claim | ClaimResult
    | ScarceRequest | ScarceAnswer | Fence | CheckpointAsk
)


def speaker(msg: Message) -> str:
    """Who is allowed to have sent ``msg`` (whose key signs it)."""
    if isinstance(msg, (Claim, ScarceRequest, ScarceAnswer, CheckpointAsk)):
        return msg.scheduler
    if isinstance(msg, ResyncRequest):
        return msg.requester
    if isinstance(msg, Batch):
        raise TypeError("a batch has no single speaker; its items are signed one by one")
    return msg.source


@dataclass(slots=True, frozen=True)
class Send:
    """An instruction from a state machine to its edge: send ``message``.

    ``to`` is None for the data plane (the stream every scheduler reads), the
    source id for control messages to a compute node, or the scheduler name for
    control messages to a scheduler.
    """

    to: str | None
    message: Message
