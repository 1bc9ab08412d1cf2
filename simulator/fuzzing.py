"""Fuzz targets for every door untrusted bytes come through (``shm fuzz``, design §6 invariant 6).

One input is one call of :meth:`FuzzTargets.one`; its first byte picks the door, the
rest is what comes through it:

* ``decoder`` – :meth:`protocol.codec.Decoder.decode`, without keys and with signatures
  required: a message or a :class:`~protocol.errors.RemoteProtocolError`, nothing else;
* ``receiver`` – a scheduler's :class:`~shared_host_manager.cache.HostStateCache` (decode,
  then the receiver) on the stream and on the control plane, then a tick: nothing may
  escape.  The cache lives across inputs, holding two sources, so a message of the fuzzer
  meets views with documents, buffers and pending claims (rebuilt every
  :data:`RESET_EVERY` inputs);
* ``reporter`` – a :class:`~compute_reporter.manager.ReporterManager`'s control door
  (``handle_bytes``: claims and resync requests, arbitrated by the source machines), then
  a poll: nothing may escape;
* ``updatelog`` – :class:`~shared_host_manager.updatelog.reader.LogReader` on a file: the
  input as a whole file, or (odd second byte) as records the harness frames with valid
  checksums after a valid header, so the fuzzer reaches the record decoding behind the CRC.
  Nothing in a file may make the reader raise;
* ``peer`` – the scheduler's peer topic (``<topic>-peers``, design §5.2): the same cache's
  :meth:`~shared_host_manager.cache.HostStateCache.ingest_peer_claim` (a peer's announced
  claim, or the host's rejection of one forwarded by that peer), then a tick: nothing may
  escape.  The views it meets hold a peer's claim and remember a rejection besides the
  pending claim (rebuilt with them).

After every input through the receiver or peer door the cache's ledgers are checked (see
:func:`check_ledgers`): a usage that is not the sum of the claims held, or is negative, is
a crash too, so the fuzzer looks for wrong accounting as well as for exceptions.

The first byte maps to the door modulo the number of doors; a door added later goes last
and the corpus's inputs are renumbered so that each keeps its door (their first byte is
rewritten to the door's index).

Life cycle: ``FuzzTargets()`` builds the parties once (state in a private temporary
directory, removed by :meth:`close`); ``one(data)`` per input, from the fuzzing engine
(atheris, :mod:`shm_cli.fuzz`) or from the unit tests replaying the corpus kept in
``tests/fuzz_corpus/``.  Any exception out of ``one`` is a crash.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import msgpack

from compute_reporter.manager import ReporterManager
from protocol.codec import Decoder, Encoder
from protocol.document import SET
from protocol.errors import RemoteProtocolError
from protocol.messages import (
    Batch,
    Claim,
    ClaimResult,
    Delta,
    Heartbeat,
    Message,
    ResyncAnswer,
    ResyncRequest,
    Snapshot,
)
from protocol.receiver import ReceiverMachine
from protocol.signing import Keyring
from shared_host_manager.cache import HostStateCache
from shared_host_manager.updatelog.format import FORMAT, HEADER, MAGIC, frame
from shared_host_manager.updatelog.reader import LogReader
from simulator.synthetic_hosts import host_doc

#: the doors, in the order of the input's first byte (modulo their number); append only
TARGETS = ("decoder", "receiver", "reporter", "updatelog", "peer")
RESET_EVERY = 1000
SOURCES = ("cn-0", "cn-1")
MASTER = b"fuzz master"
#: the fuzzed scheduler, and the live peer whose claims it holds
SCHEDULER = "sch-0"
PEER = "sch-1"


class LedgerError(AssertionError):
    """A view's claim ledger does not add up (a crash, like an exception out of a door)."""


def check_ledgers(receiver: ReceiverMachine) -> None:
    """Every view's ``pending_usage`` and ``peer_usage`` are the sums of the claims its two
    ledgers hold, and never negative (protocol/receiver.py, design §5.2)."""
    for view in receiver.sources.values():
        for name, ledger, usage in (("pending", view.pending, view.pending_usage),
                                    ("peer", view.peer, view.peer_usage)):
            total: dict[str, int] = {}
            for held in ledger.values():
                for resource, amount in held.claim.resources.items():
                    total[resource] = total.get(resource, 0) + amount
            if {r: a for r, a in total.items() if a} != {r: a for r, a in usage.items() if a}:
                raise LedgerError(f"{view.source}: {name} usage {usage} is not the sum {total} "
                                  f"of the {len(ledger)} claims held")
            if any(a < 0 for a in usage.values()):
                raise LedgerError(f"{view.source}: negative {name} usage {usage}")


class FuzzTargets:
    def __init__(self) -> None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self._dir = tempfile.mkdtemp(prefix="shm-fuzz-", dir=base)
        self._log = os.path.join(self._dir, "fuzz.ulog.0001")
        self._plain = Decoder()
        self._signed = Decoder(Keyring(master=MASTER))
        self.inputs = 0
        self.by_target = dict.fromkeys(TARGETS, 0)
        self._reset()

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def _reset(self) -> None:
        self._now = 0.0
        docs = {s: host_doc(s, vcpus=8, memory_mb=8192, disk_gb=100) for s in SOURCES}
        self.reporter = ReporterManager("rep-0", docs, dict.fromkeys(SOURCES, 5),
                                        heartbeat_interval=1.0, ring_size=4)
        self.cache = HostStateCache(ReceiverMachine(SCHEDULER, reorder_window=4, claim_deadline=2.0,
                                                    peer_claim_ttl=1.0),
                                    lambda endpoint, msg: None, clock=lambda: self._now)
        # the views the fuzzer's messages meet: both sources held, one claim pending, a peer's
        # claim held on each source, a rejection of another of its claims remembered
        batches, _ = self.reporter.poll(0.0)
        for b in batches:
            self.cache.ingest_stream(Encoder().encode(b), None)
        receiver = self.cache.receiver
        view = receiver.sources["cn-0"]
        receiver.add_claim(
            Claim(f"{SCHEDULER}:1", SCHEDULER, "cn-0", view.epoch, view.seq, {"vcpus": 1}, "vm-1"), 0.0)
        for i, source in enumerate(SOURCES):
            view = receiver.sources[source]
            self.cache.ingest_peer_claim(Encoder().encode(
                Claim(f"{PEER}:{i + 1}", PEER, source, view.epoch, view.seq,
                      {"vcpus": 2, "memory_mb": 1024}, f"vm-p{i + 1}")))
        self.cache.ingest_peer_claim(Encoder().encode(
            ClaimResult(f"{PEER}:9", PEER, "cn-1", False, view.epoch, view.seq, "no fit")))

    # -- one input ---------------------------------------------------------------------

    def one(self, data: bytes) -> None:
        """Feed one input through the door its first byte picks; raises only on a crash."""
        self.inputs += 1
        if not data:
            return
        target = TARGETS[data[0] % len(TARGETS)]
        self.by_target[target] += 1
        body = bytes(data[1:])
        if target == "decoder":
            self._decoder(body)
        elif target == "receiver":
            self._receiver(body)
        elif target == "reporter":
            self._reporter(body)
        elif target == "peer":
            self._peer(body)
        else:
            self._updatelog(body)

    def _decoder(self, body: bytes) -> None:
        for decoder in (self._plain, self._signed):
            try:
                decoder.decode(body)
            except RemoteProtocolError:
                pass

    def _receiver(self, body: bytes) -> None:
        if self.inputs % RESET_EVERY == 0:
            self._reset()
        self._now += 0.05
        self.cache.ingest_stream(body, self.inputs)
        self.cache.ingest_control(body)
        self.cache.tick()
        check_ledgers(self.cache.receiver)

    def _peer(self, body: bytes) -> None:
        if self.inputs % RESET_EVERY == 0:
            self._reset()
        self._now += 0.05
        self.cache.ingest_peer_claim(body)
        self.cache.tick()
        check_ledgers(self.cache.receiver)

    def _reporter(self, body: bytes) -> None:
        if self.inputs % RESET_EVERY == 0:
            self._reset()
        self._now += 0.05
        self.reporter.handle_bytes(body, self._plain, self._now)
        self.reporter.poll(self._now)

    def _updatelog(self, body: bytes) -> None:
        if body[:1] and body[0] % 2:
            header = msgpack.packb([HEADER, {"format": FORMAT, "role": "scheduler", "name": "f",
                                             "session": "s", "config": {}}], use_bin_type=True)
            content = MAGIC + frame(header) + b"".join(frame(part) for part in body[1:].split(b"\xc1"))
        else:
            content = body[1:]
        with open(self._log, "wb") as f:
            f.write(content)
        for _ in LogReader([self._log]):
            pass


def seed_inputs() -> dict[str, bytes]:
    """A small corpus of valid inputs for every door (``shm fuzz --write-corpus``)."""
    plain, signed = Encoder(), Encoder(Keyring(master=MASTER))
    doc = host_doc("h", vcpus=8)
    delta = Delta("cn-0", 5, 1, [[SET, "compute", "vcpus_used", 2]], ["sch-0:1"])
    snapshot = Snapshot("cn-1", 6, 0, doc, ["c"])
    heartbeat = Heartbeat("cn-0", 5, 1, b"\x00" * 16)
    messages: dict[str, Message] = {
        "delta": delta, "snapshot": snapshot, "heartbeat": heartbeat,
        "batch": Batch([delta, snapshot, heartbeat], "rep-0"),
        "resync_request": ResyncRequest("cn-0", "sch-0", 5, 0, False),
        "resync_answer": ResyncAnswer("cn-0", "sch-0", [delta]),
        "claim": Claim("sch-0:2", "sch-0", "cn-0", 5, 0, {"vcpus": 1, "memory_mb": 512}, "vm-2",
                       {"flavor": "m1"}),
        "claim_result": ClaimResult("sch-0:1", "sch-0", "cn-0", False, 5, 1, "no fit", [delta]),
    }
    out: dict[str, bytes] = {}
    for name, msg in messages.items():
        for enc_name, enc in (("plain", plain), ("signed", signed)):
            body = enc.encode(msg)
            for i, target in enumerate(TARGETS[:3]):
                out[f"{target}-{name}-{enc_name}"] = bytes([i]) + body
    # the peer topic: a peer's announced claim, the host's rejection of one forwarded by the
    # peer (of a claim held, and of one not held), an acceptance (foreign), our own claim
    # echoed back, a claim on an epoch not held, and a stream message where none belongs
    peer = TARGETS.index("peer")
    peer_messages: dict[str, Message] = {
        "claim": Claim(f"{PEER}:3", PEER, "cn-0", 5, 0, {"vcpus": 1, "memory_mb": 512}, "vm-p3",
                       {"flavor": "m1"}),
        "rejection": ClaimResult(f"{PEER}:3", PEER, "cn-0", False, 5, 1, "no fit", [delta]),
        "rejection_unheld": ClaimResult(f"{PEER}:4", PEER, "cn-1", False, 6, 0, "no fit"),
        "acceptance": ClaimResult(f"{PEER}:2", PEER, "cn-1", True, 5, 1),
        "echo": Claim(f"{SCHEDULER}:2", SCHEDULER, "cn-0", 5, 0, {"vcpus": 1}, "vm-2"),
        "stale_epoch": Claim(f"{PEER}:5", PEER, "cn-1", 4, 0, {"vcpus": 1}, "vm-p5"),
        "delta": delta,
    }
    for name, msg in peer_messages.items():
        for enc_name, enc in (("plain", plain), ("signed", signed)):
            out[f"peer-{name}-{enc_name}"] = bytes([peer]) + enc.encode(msg)
    record = msgpack.packb([1, 1.5, 7, plain.encode(delta)], use_bin_type=True)  # RX_STREAM
    out["updatelog-records"] = bytes([3, 1]) + record + b"\xc1" + record
    out["updatelog-file"] = bytes([3, 0]) + MAGIC + b"\x00" * 8
    return out


__all__ = ["TARGETS", "FuzzTargets", "LedgerError", "check_ledgers", "seed_inputs"]
