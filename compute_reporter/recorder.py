"""Recording a reporter's update log: what it handled, published and cast.

Role: the :class:`~compute_reporter.service.ReporterObserver` that writes a
reporter's log (``shm reporter`` with ``[update_log] enabled``), and the
machinery every recorder shares: naming the party and writing the header,
appending records under its own lock, disabling itself on a write failure, closing.
The scheduler's :class:`~shared_host_manager.updatelog.recorder.Recorder` extends
it with the cache's and the engine's observers (and records a reporter just as
this does), so both parties' logs have one format
(:mod:`transport.updatelog.format`) and one writer (:mod:`transport.updatelog.writer`),
and a reporter process imports nothing of the scheduler package.

Life cycle::

    ReporterRecorder(directory)      detached: records nothing
      --reporter_attached-->         header written, recording
      --(a write fails)-->           disabled: logged once, never breaks the reporter
      --close()-->                   buffer written, closed

Records go to a memory buffer written out in large chunks, without fsync: a
crash can lose the unwritten tail, and the reader says where the log ends.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from oslo_config import cfg

from compute_reporter.manager import ReporterManager
from compute_reporter.service import ReporterObserver
from protocol import codec
from protocol.messages import PROTOCOL_VERSION, Message, Send
from transport.updatelog.format import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    DROPPED_BODY_LIMIT,
    FORMAT,
    NOTE,
    PUBLISHED,
    REPORTER,
    RX_CONTROL,
    RX_DROPPED,
    SCHEDULER,
    TX,
    log_base,
)
from transport.updatelog.opts import recorder_params
from transport.updatelog.writer import LogWriter

LOG = logging.getLogger(__name__)


class RecordedReporter(Protocol):
    """What a reporter's recorder reads when it attaches: a :class:`ReporterService`, or a
    simulated reporter driving the same manager (``shm faults``)."""

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> Mapping[str, Any]: ...
    @property
    def manager(self) -> ReporterManager: ...
    @property
    def clock(self) -> Callable[[], float]: ...


class ReporterRecorder(ReporterObserver):
    """Records one reporter into an update log; the base of every party's recorder.

    Built detached; :meth:`reporter_attached` (or a subclass's attach for another
    party) names the party, writes the header and starts recording.  Every hook is
    cheap and never raises.
    """

    def __init__(self, directory: str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES, max_total_bytes: int | None = None,
                 max_age: float | None = None) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        #: retention of the log's parts (LogWriter): None keeps everything
        self.max_total_bytes = max_total_bytes
        self.max_age = max_age
        self.buffer_bytes = buffer_bytes
        self.role: str | None = None
        self.name: str | None = None
        self.session = uuid.uuid4().hex[:16]
        self._lock = threading.Lock()
        self._writer: LogWriter | None = None
        self._clock: Callable[[], float] = time.monotonic
        self.enabled = False
        self.closed = False
        self.errors = 0

    # -- life cycle --------------------------------------------------------------

    @property
    def path(self) -> str | None:
        """The log's base path (parts are ``path.0001``, ...)."""
        return self._writer.base if self._writer is not None else None

    @property
    def files(self) -> list[str]:
        return list(self._writer.files) if self._writer is not None else []

    @property
    def records(self) -> int:
        return self._writer.records if self._writer is not None else 0

    def _start(self, role: str, name: str, config: dict[str, Any], clock: Callable[[], float],
               log_format: int = FORMAT) -> None:
        """Name the party and open its log (``log_format``: what the header says; a scheduler's
        recorder passes the one whose checkpoints it writes)."""
        if self._writer is not None:
            raise RuntimeError(f"recorder already attached to {self.role} {self.name!r}")
        self.role, self.name, self._clock = role, name, clock
        header = {
            "format": log_format, "role": role, "name": name, "session": self.session,
            "config": config, "clock": clock(), "wall": time.time(),
            "protocol_version": PROTOCOL_VERSION, "host": socket.gethostname(), "pid": os.getpid(),
        }
        # only a scheduler's parts get a base (its views): a reporter's replay needs none
        self._writer = LogWriter(log_base(self.directory, role, name), header,
                                 max_file_bytes=self.max_file_bytes, buffer_bytes=self.buffer_bytes,
                                 max_total_bytes=self.max_total_bytes, max_age=self.max_age,
                                 bases=role == SCHEDULER)
        self.enabled = True

    def reporter_attached(self, service: RecordedReporter) -> None:
        """Start recording a :class:`~compute_reporter.service.ReporterService` (from its ``start()``)."""
        config = dict(service.params)
        config["sources"] = {s: m.epoch for s, m in service.manager.machines.items()}
        self._start(REPORTER, service.name, config, service.clock)

    def close(self) -> None:
        """Write everything buffered and close; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._writer is None:
            return
        with self._lock:
            self.enabled = False
            try:
                self._writer.close()
            except OSError as exc:
                LOG.warning("update log %s: close failed: %s", self._writer.base, exc)

    def flush(self) -> None:
        with self._lock:
            if self._writer is not None and self.enabled:
                try:
                    self._writer.flush()
                except OSError as exc:
                    self._failed_locked(exc)

    # -- internals -----------------------------------------------------------------

    def _append(self, record: list[Any]) -> None:
        with self._lock:
            writer = self._writer
            if not self.enabled or writer is None:  # (enabled implies a writer)
                return
            try:
                writer.append(record)
            except Exception as exc:  # noqa: BLE001
                self._failed_locked(exc)

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failed_locked(exc)

    def _failed_locked(self, exc: BaseException) -> None:
        self.errors += 1
        if self.enabled:
            self.enabled = False
            LOG.error("update log of %s %s failed, recording stopped: %s", self.role, self.name, exc)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 — recording must never break the caller
            self._failed(exc)

    # -- the reporter's observer (and what every party records) --------------------------

    def control(self, body: bytes, now: float, sends: Sequence[Send] | None = None) -> None:
        """A claim or resync request was handled (the bytes as received)."""
        if self.enabled:
            self._guard(self._append, [RX_CONTROL, now, body])

    def dropped(self, body: bytes, plane: str, offset: int | None, now: float) -> None:
        """An invalid message was dropped (recorded, never replayed)."""
        if self.enabled:
            try:
                data = bytes(body[:DROPPED_BODY_LIMIT]) if isinstance(
                    body, (bytes, bytearray, memoryview)) else repr(body)[:1024].encode()
                self._append([RX_DROPPED, now, plane, offset, data])
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)

    def published(self, body: bytes, now: float) -> None:
        """A reporter published ``body`` on the stream."""
        if self.enabled:
            self._guard(self._append, [PUBLISHED, now, body])

    def sent(self, to: str | None, message: Message, now: float) -> None:
        """A control message went out (a reporter's claim result or resync answer; a claim)."""
        if self.enabled:
            self._guard(lambda: self._append([TX, now, to, codec.encode(message)]))

    def note(self, now: float, text: str) -> None:
        if self.enabled:
            self._guard(self._append, [NOTE, now, text])


def from_conf(conf: cfg.ConfigOpts) -> ReporterRecorder | None:
    """A detached reporter's recorder if ``[update_log] enabled``, else None (OperatorError
    on a missing or unwritable directory; see :mod:`transport.updatelog.opts`)."""
    params = recorder_params(conf)
    if params is None:
        return None
    del params["checkpoint_interval"]  # a reporter's log has no checkpoints (no views to digest)
    return ReporterRecorder(**params)


__all__ = ["RecordedReporter", "ReporterRecorder", "from_conf"]
