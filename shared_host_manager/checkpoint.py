"""Checkpoints of the whole view on a stream of their own: a new scheduler ready in seconds.

Role: a scheduler that starts with no saved cache file (design §4.4) would rebuild every view
from the host-state stream's retained history and ask every source it cannot rebuild for a
snapshot; at 10 000 sources that took 27.7 s and about two resync requests per source.
Instead, a running scheduler publishes, every ``[cache] checkpoint_interval`` seconds, what
:meth:`~shared_host_manager.cache.HostStateCache.dump_state` returns (the very bytes a local
save writes: every held view's source, epoch, seq and document and how long its source had
been silent, the wall-clock time of the cut, the host-state stream offset applied, the known
origins), compressed, on the stream named like the host-state stream plus
``.checkpoint``.  A newcomer restores the newest one as it restores its own file and reads
the host-state stream after the checkpoint's offset (design §4.5).

Life cycle of a checkpoint::

    taken      the publishing scheduler's cache state, cut under its lock (one consistent cut:
               every stream message up to ``offset`` applied, and resync answers since;
               the documents shared copy on write, so the lock is held for O(sources)
               and the cut is packed outside it)
    published  compressed (zlib), signed when signing is on, appended to
               ``<stream>.checkpoint`` (retention: a few checkpoints, see RETENTION)
    asked      a scheduler starting without a state file fans a ``checkpoint_ask`` out to its
               peers (a token of its own); the publisher takes a checkpoint at once (at most
               one each ANSWER_GAP seconds) and names the token in it, so the newcomer has
               seconds of the stream to replay instead of up to ``checkpoint_interval``
    loaded     the newcomer attaches at "last" on that stream, waits up to ``wait`` seconds
               once attached for the newest and, when that one does not answer its ask, up
               to ``answer_wait`` more for one that does (never longer than the newest is
               old: replaying that much is quicker); it restores the newest that
               decodes, checks and verifies: each view fed to the receiver as a snapshot,
               the stream read from ``offset + 1``; none such: today's cold start
    superseded the next checkpoint; retention drops the old ones (by size and age)

Who publishes: the coordinator, the first live peer by name (as for scarce requests, design
§5.4), so one scheduler pays for it and the others only read; a scheduler that knows no
peers (membership off, or alone) publishes itself, every interval with ±10 % jitter so that
schedulers started together do not publish together.  The same one answers asks; a
publication in answer restarts the interval, so asks add at most one checkpoint a second
and none while they keep within the interval.  A scheduler publishes only once it has
applied something from the host-state stream or from a cell's (no offset: nothing to resume
from); with a stream per cell the deployment's may hold nothing (membership off, no API-level
source), and the cells' offsets are then the whole cut.

Why a checkpoint cannot put a view ahead of its source: every version it holds was applied by
some scheduler's receiver from what the source published (its stream or its resync answers),
and a source never goes back within an epoch (epochs only grow, design §3).  A checkpoint
taken by a scheduler that was behind holds older versions, and the stream after its offset
brings them forward (a gap there is resynced as usual).  A damaged checkpoint fails its zlib
check, its BLAKE2b checksum or its MAC and is never restored.

Authentication: with ``[signing] enabled`` a checkpoint carries an HMAC-SHA256 with the key
derived from the master secret for the reserved speaker name :data:`SIGNER`: only holders of
the master, the schedulers, can make or check it; a compute node, which holds its own key and
the scheduler keys, cannot forge one (it could with a scheduler's own key, and so speak for
every host).  A scheduler without the master (a key file only) neither publishes nor loads
checkpoints.  Signing off: the checksum is all (as for every message then).

Membership entries (``scheduler/<name>``) are not restored: the live peers come from the
stream alone, so a dead peer's entry in a checkpoint does not count as live.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from protocol.document import MAX_NAME_LEN
from protocol.signing import Keyring
from shared_host_manager.cache import HostStateCache
from shared_host_manager.membership import SOURCE_PREFIX
from transport.base import DataPlane, StreamConsumer, StreamPublisher

LOG = logging.getLogger(__name__)

FORMAT = 1
#: the checkpoint stream's name is the host-state stream's plus this
SUFFIX = ".checkpoint"
#: the speaker whose derived key signs checkpoints: no hostname or scheduler name has an "@"
SIGNER = "@checkpoint"
#: retention of the checkpoint stream (RabbitMQ): the newest few checkpoints, whole segments
#: being dropped (a 10 000-host checkpoint compresses to a few MiB, see docs/benchmarks.md)
RETENTION: dict[str, Any] = {"max_age": "15m", "max_length_bytes": 256 * 1024 ** 2,
                             "max_segment_size_bytes": 32 * 1024 ** 2}
#: once attached at "last", a newcomer waits this long for a checkpoint (the broker sends the
#: last chunk at once; none on the stream: that long, then a cold start)
DEFAULT_WAIT = 2.0
#: most seconds to attach to the checkpoint stream (connect, declare, consume): a loaded
#: broker took over 2 s at 10 000 sources, which a wait counted from the start mistook for
#: an empty stream
_ATTACH_TIMEOUT = 10.0
#: after the first checkpoint arrives, this long more for others of the same chunk (sent
#: back to back)
_QUIET = 0.1
#: a newcomer that asked waits this long after the newest checkpoint arrived for one that
#: answers its ask (the publisher's cut and pack take about 0.3 s at 10 000 hosts); none
#: (no publisher running, or one that predates asks): the newest restores as before
ANSWER_WAIT = 3.0
#: least seconds between two publications of one scheduler in answer to asks: many
#: newcomers at once share a checkpoint instead of costing one each
ANSWER_GAP = 1.0
#: most tokens a checkpoint names (more asks at once are answered by the next one)
MAX_ANSWERS = 64
#: largest decompressed state accepted: bounds what a damaged or hostile blob can take
MAX_STATE_BYTES = 1024 ** 3


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (one line: why)."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    scheduler: str
    taken_ns: int
    sources: int
    #: the host-state stream offset applied when it was taken
    offset: int | None
    #: what HostStateCache.dump_state returned (checksummed)
    state: bytes
    #: the tokens of the asks it answers (taken after each of them arrived)
    answers: tuple[str, ...] = ()


def _signed_part(scheduler: str, taken_ns: int, blob: bytes) -> bytes:
    return msgpack.packb([FORMAT, scheduler, taken_ns, blob], use_bin_type=True)


def encode(state: bytes, *, scheduler: str, taken_ns: int, sources: int, offset: int | None,
           keyring: Keyring | None, level: int = 1, answers: tuple[str, ...] = ()) -> bytes:
    """A checkpoint message; ``state`` from :meth:`HostStateCache.dump_state`.  Level 1: the
    documents compress about as well as at level 6 and several times faster (measured).
    ``answers``: tokens of the asks it answers, outside the MAC (a forged list can only make
    a newcomer prefer one signed checkpoint to another)."""
    blob = zlib.compress(state, level)
    envelope: dict[str, Any] = {"format": FORMAT, "scheduler": scheduler, "taken_ns": taken_ns,
                                "sources": sources, "offset": offset, "state": blob}
    if answers:
        envelope["answers"] = list(answers)
    if keyring is not None:
        envelope["mac"] = keyring.sign(SIGNER, _signed_part(scheduler, taken_ns, blob))
    return msgpack.packb(envelope, use_bin_type=True)


def decode(data: bytes, keyring: Keyring | None) -> Checkpoint:
    """The checkpoint in ``data``; :class:`CheckpointError` if it is not one, is damaged, or
    (``keyring`` given: signing on) is not signed with the checkpoint key."""
    try:
        envelope = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise CheckpointError(f"not msgpack: {exc}") from None
    if type(envelope) is not dict or envelope.get("format") != FORMAT:
        raise CheckpointError(f"not a checkpoint of format {FORMAT}")
    scheduler, taken_ns, blob = envelope.get("scheduler"), envelope.get("taken_ns"), \
        envelope.get("state")
    sources, offset = envelope.get("sources"), envelope.get("offset")
    answers = envelope.get("answers", [])
    if (type(scheduler) is not str or type(taken_ns) is not int or type(blob) is not bytes
            or type(sources) is not int or not (offset is None or type(offset) is int)
            or not _token_list(answers)):
        raise CheckpointError("malformed checkpoint envelope")
    if keyring is not None:
        mac = envelope.get("mac")
        if type(mac) is not bytes:
            raise CheckpointError(f"unsigned checkpoint from {scheduler} (signing is on)")
        if keyring.verify(SIGNER, _signed_part(scheduler, taken_ns, blob), mac) is not True:
            raise CheckpointError(f"bad signature on the checkpoint from {scheduler}")
    inflate = zlib.decompressobj()
    try:
        state = inflate.decompress(blob, MAX_STATE_BYTES)
    except zlib.error as exc:
        raise CheckpointError(f"damaged checkpoint from {scheduler}: {exc}") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise CheckpointError(f"checkpoint from {scheduler} truncated or over "
                              f"{MAX_STATE_BYTES} bytes")
    return Checkpoint(scheduler, taken_ns, sources, offset, state, tuple(answers))


def _token_list(value: Any) -> bool:
    return (type(value) is list and len(value) <= MAX_ANSWERS
            and all(type(t) is str and 0 < len(t) <= MAX_NAME_LEN for t in value))


def head(data: bytes) -> tuple[int | None, tuple[str, ...]]:
    """When a stored checkpoint says it was taken (ns) and the tokens it says it answers,
    read from its envelope alone (not checked: :func:`decode` is what a restore trusts);
    ``(None, ())`` if it is not a checkpoint."""
    try:
        envelope = msgpack.unpackb(data, raw=False)
    except Exception:
        return None, ()
    if type(envelope) is not dict:
        return None, ()
    taken: Any = envelope.get("taken_ns")
    value: Any = envelope.get("answers")
    return (taken if type(taken) is int else None), (tuple(value) if _token_list(value) else ())


def _not_membership(source: str) -> bool:
    return not source.startswith(SOURCE_PREFIX)


class Checkpointer:
    """One scheduler's checkpoints: :meth:`restore` at start, then :meth:`start` publishing.

    ``plane``: a data plane on the checkpoint stream; ``peers``: the live schedulers, sorted
    (this one's publications follow them: see the module docstring).
    """

    def __init__(self, name: str, cache: HostStateCache, plane: DataPlane, *,
                 interval: float, peers: Callable[[], tuple[str, ...]],
                 keyring: Keyring | None = None, wait: float = DEFAULT_WAIT) -> None:
        self.name = name
        self.cache = cache
        self.plane = plane
        self.interval = interval
        self.wait = wait
        self._peers = peers
        self._keyring = keyring
        self._stop = threading.Event()
        #: set by stop() and by an ask: the publishing thread looks again
        self._wake = threading.Event()
        #: tokens of the asks not answered yet
        self._asks: set[str] = set()
        self._asks_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._publisher: StreamPublisher | None = None
        self.published = 0
        self.publish_failures = 0
        self.last_published: tuple[int, int | None, int] | None = None  # bytes, offset, sources
        #: the longest a publication held the cache lock (its cut) and took to pack, compress
        #: and sign outside it, in seconds
        self.held_s_max = 0.0
        self.pack_s_max = 0.0
        #: the checkpoint this scheduler started from (None: it did not)
        self.restored: Checkpoint | None = None
        self.rejected = 0
        #: seconds a newcomer waits for the answer to its ask (ANSWER_WAIT)
        self.answer_wait = ANSWER_WAIT
        #: this newcomer's ask: its token, and whether the checkpoint restored answered it
        self.asked_token: str | None = None
        #: publications that answered asks, and asks received
        self.answered = 0
        self.asks = 0
        self._usable = self._key_ok()

    def _key_ok(self) -> bool:
        if self._keyring is None:
            return True
        try:
            self._keyring.sign(SIGNER, b"")
        except KeyError:
            LOG.warning("checkpoints off: signing is on and this scheduler has no master key "
                        "to derive the checkpoint key from ([signing] master_key)")
            return False
        return True

    # -- a newcomer --------------------------------------------------------------------

    def restore(self, ask: Callable[[str], None] | None = None) -> int | None:
        """Restore the newest usable checkpoint into the cache; the deployment stream's offset
        to resume after (each cell's is in the cache's ``cell_offsets``), None when nothing
        was applied there or no checkpoint was restored (:attr:`restored` tells which).

        ``ask``: sends this scheduler's ask with the token given (fanned out to the peers);
        the newest checkpoint is then awaited until one answers it, at most
        :attr:`answer_wait` seconds more."""
        if not self._usable:
            return None
        started = time.monotonic()
        token = None
        if ask is not None and getattr(self.plane, "threaded", True):
            token = uuid.uuid4().hex
            try:
                ask(token)
            except Exception as exc:  # the newest periodic checkpoint serves as before
                LOG.info("could not ask the peers for a checkpoint: %s", exc)
                token = None
        self.asked_token = token
        for body, offset in sorted(self.read_newest(token), key=lambda m: m[1],
                                   reverse=True):
            try:
                checkpoint = decode(body, self._keyring)
            except CheckpointError as exc:
                self.rejected += 1
                LOG.warning("ignoring checkpoint at offset %d: %s", offset, exc)
                continue
            where = (f"the checkpoint of {checkpoint.scheduler} taken "
                     f"{max(0.0, (time.time_ns() - checkpoint.taken_ns) / 1e9):.1f} s ago"
                     + (" in answer to its ask" if token in checkpoint.answers else ""))
            restored = self.cache.restore_state(checkpoint.state, where, keep=_not_membership)
            if restored is None:
                self.rejected += 1
                continue
            self.restored = checkpoint
            LOG.info("started from %s in %.2f s (%d sources)", where,
                     time.monotonic() - started, checkpoint.sources)
            return restored.offset
        LOG.info("no usable checkpoint within %.1f s: cold start", self.wait)
        return None

    def read_newest(self, answer: str | None = None) -> list[tuple[bytes, int]]:
        """``(body, offset)`` of the checkpoint stream's last chunk (and of any message
        arriving meanwhile), as stored: not decoded nor checked.  ``answer``: once the last
        chunk is in, keep reading until a checkpoint names that token, at most
        :attr:`answer_wait` seconds."""
        got: list[tuple[bytes, int]] = []
        arrived = threading.Event()

        def on_message(body: bytes, offset: int) -> None:
            got.append((body, offset))
            arrived.set()

        consumer: StreamConsumer = self.plane.stream_consumer()
        consumer.start(on_message, "last")
        try:
            if getattr(self.plane, "threaded", True):
                wait_attached = getattr(consumer, "wait_attached", None)
                if wait_attached is not None:
                    wait_attached(_ATTACH_TIMEOUT)
                # the in-process bus knows at once whether anything is there; a broker does not
                empty = not arrived.is_set() and getattr(consumer, "pending", None) == 0
                if not empty and arrived.wait(self.wait):
                    time.sleep(_QUIET)
                    if answer is not None:
                        self._await_answer(got, arrived, answer)
            else:  # the synchronous in-process bus delivers only when polled
                consumer.poll()  # type: ignore[attr-defined]
        finally:
            consumer.stop()
        return list(got)

    def _await_answer(self, got: list[tuple[bytes, int]], arrived: threading.Event,
                      token: str) -> bool:
        """Wait until ``got`` holds a checkpoint answering ``token`` (True), at most
        :attr:`answer_wait` seconds and no longer than the newest there is old: the stream
        since a checkpoint that young replays in less than the wait (False)."""
        heads = [head(body) for body, _ in got]
        if any(token in tokens for _, tokens in heads):
            return True
        newest = max((taken for taken, _ in heads if taken is not None), default=None)
        age = float("inf") if newest is None else max(0.0, (time.time_ns() - newest) / 1e9)
        deadline = time.monotonic() + min(self.answer_wait, age)
        checked = len(heads)  # one arriving since the heads were read is checked below
        while True:
            arrived.clear()  # before the check: a message arriving after it sets it again
            upto = len(got)
            if any(token in head(body)[1] for body, _ in got[checked:upto]):
                return True
            checked = upto
            left = deadline - time.monotonic()
            if left <= 0:
                LOG.info("no checkpoint answered this scheduler's ask within %.1f s: the "
                         "newest serves", min(self.answer_wait, age))
                return False
            arrived.wait(left)

    # -- a running scheduler ------------------------------------------------------------

    def asked(self, token: str) -> None:
        """A starting peer's ask (the peer topic's handler): the publishing thread answers
        it with a checkpoint taken now, if this scheduler is the one that publishes."""
        if not self._usable or self.interval <= 0:
            return
        with self._asks_lock:
            self.asks += 1
            self._asks.add(token)
        self._wake.set()

    def start(self) -> None:
        if not self._usable or self.interval <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"scheduler-{self.name}-checkpoints")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        # closed first: a publish retrying against a lost broker gives up at once instead of
        # holding stop() for its publish_timeout
        if self._publisher is not None:
            self._publisher.close()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None

    def publishes(self) -> bool:
        """Whether this scheduler is the one to publish now (the coordinator, or alone)."""
        peers = self._peers()
        return not peers or peers[0] == self.name

    def _run(self) -> None:
        last = float("-inf")  # the last publication, by the monotonic clock
        due = time.monotonic() + self._jittered()
        while not self._stop.is_set():
            now = time.monotonic()
            # an ask is answered now, or once ANSWER_GAP has passed since the last publication
            wait = (min(due, last + ANSWER_GAP) if self._asks else due) - now
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            with self._asks_lock:
                tokens = tuple(sorted(self._asks))[:MAX_ANSWERS]
                self._asks.difference_update(tokens)
            try:
                if self.publishes() and self.publish(tokens) and tokens:
                    self.answered += 1
            except Exception:  # the next interval tries again; a newcomer falls back meanwhile
                if self._stop.is_set():  # stop() closed the publisher under this publish
                    return
                self.publish_failures += 1
                LOG.exception("scheduler %s could not publish a checkpoint", self.name)
            last = time.monotonic()
            due = last + self._jittered()

    def _jittered(self) -> float:
        return self.interval * random.uniform(0.9, 1.1)

    def publish(self, answers: tuple[str, ...] = ()) -> bool:
        """Take and publish one checkpoint now, naming the tokens of the asks it ``answers``;
        False when there is nothing to resume from."""
        cut = self.cache.cut()  # under the lock, O(sources); packed below, outside it
        offset = cut.offset
        sources = len(cut.views)
        # a stream per cell and nothing on the deployment's: the cells' offsets are the cut
        if (offset is None and not cut.cells) or not sources:
            return False
        start = time.perf_counter()
        body = encode(cut.pack(), scheduler=self.name, taken_ns=time.time_ns(), sources=sources,
                      offset=offset, keyring=self._keyring, answers=answers)
        self.held_s_max = max(self.held_s_max, cut.held_s)
        self.pack_s_max = max(self.pack_s_max, time.perf_counter() - start)
        if self._publisher is None:
            if self._stop.is_set():
                return False
            self._publisher = self.plane.stream_publisher()
        self._publisher.publish(body)
        self.published += 1
        self.last_published = (len(body), offset, sources)
        LOG.debug("checkpoint published: %d sources at offset %s, %d bytes", sources, offset,
                  len(body))
        return True


def checkpoint_plane(data_plane: object) -> DataPlane | None:
    """The checkpoint stream's plane next to ``data_plane``, None if its backend has none."""
    sibling = getattr(data_plane, "sibling_stream", None)
    if sibling is None:
        return None
    plane: DataPlane = sibling(SUFFIX, **RETENTION)
    return plane


__all__ = ["ANSWER_GAP", "ANSWER_WAIT", "FORMAT", "SIGNER", "SUFFIX", "Checkpoint",
           "CheckpointError", "Checkpointer", "checkpoint_plane", "decode", "encode", "head"]
