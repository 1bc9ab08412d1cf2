"""Writing an update log: append-only, buffered, rotating files of one party.

Life cycle of a :class:`LogWriter`::

    LogWriter(base, header)   continues after the parts already on disk (a restarted
                              process appends a new session) and opens part N+1,
                              header first
      append(record)*         into a memory buffer; written out at buffer_bytes
      flush()                 buffer -> file; a part past max_file_bytes is closed
                              and the next one opened (header again), then
                              retention runs (below) and ``rotated`` is set
      append_base(records)    right after a rotation, the recorder writes the
                              part's *base* (every held view, as restore
                              records), so that a part can be replayed without
                              the parts before it; the base does not count
                              towards max_file_bytes
      close()                 last flush

Retention (``max_total_bytes``, ``max_age``): whenever a part is opened, the
oldest parts of this log -- of any session, never the part being written --
are deleted while they are older than ``max_age`` seconds or the log's parts
together exceed ``max_total_bytes``.  Replay starts at the oldest part left
(its base restores the views; timers and pending claims from before it are not
reproduced, as for a recorder attached to a running cache).

Not thread-safe: the recorder serialises appends under its own lock.  No
fsync: a crash can lose the unwritten tail, which the reader reports as the
end of that session (:mod:`.reader`).  The framing is :mod:`.format`.
"""

from __future__ import annotations

import io
import logging
import os
import time
from typing import Any

import msgpack

from protocol import hashing
from transport.updatelog.format import (
    DEFAULT_BUFFER_BYTES,
    FRAME,
    HEADER,
    MAGIC,
    frame,
    part_paths,
)
from transport.updatelog.reader import LogReader

LOG = logging.getLogger(__name__)


class LogWriter:
    """Append-only, buffered, rotating writer of one log (not thread-safe: the recorder locks)."""

    def __init__(self, base: str, header: dict[str, Any], *, max_file_bytes: int,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES, max_total_bytes: int | None = None,
                 max_age: float | None = None, bases: bool = False) -> None:
        self.base = base
        #: parts after the first get a base (a scheduler's log; see append_base)
        self.bases = bases
        self.header = dict(header)
        self.max_file_bytes = max_file_bytes
        self.buffer_bytes = buffer_bytes
        self.max_total_bytes = max_total_bytes
        self.max_age = max_age
        #: a part was opened after the first: the recorder owes it a base (append_base)
        self.rotated = False
        #: parts deleted by retention (paths)
        self.deleted: list[str] = []
        self._base_bytes = 0
        self._packer = msgpack.Packer(use_bin_type=True)
        self._buf = bytearray()
        self._file: io.FileIO | None = None
        self._size = 0
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
        self.part, self.records = self._continue_after_existing()
        self.files: list[str] = []
        self._open()

    def _continue_after_existing(self) -> tuple[int, int]:
        parts = part_paths(self.base)
        if not parts:
            return 0, 0
        last = parts[-1]
        reader = LogReader([last])
        count = sum(1 for rec in reader if rec.index >= 0)  # headers are not numbered
        first = reader.headers[0].get("first_record", 0) if reader.headers else 0
        return int(last[len(self.base) + 1:]), int(first or 0) + count

    def _open(self) -> None:
        while True:
            self.part += 1
            path = f"{self.base}.{self.part:04d}"
            try:
                self._file = open(path, "xb", buffering=0)  # noqa: SIM115 — closed in close()
                break
            except FileExistsError:
                continue
        rotation = bool(self.files) and self.bases  # a later part of this session: it gets a base
        self.files.append(path)
        header = dict(self.header, part=self.part, first_record=self.records)
        if rotation:
            header["base"] = True
        head = MAGIC + frame(msgpack.packb([HEADER, header], use_bin_type=True))
        self._file.write(head)
        self._size = len(head)
        self._base_bytes = 0
        self.rotated = rotation
        self._retain(path)

    def _retain(self, current: str) -> None:
        """Delete the oldest parts beyond max_age / max_total_bytes (never ``current``)."""
        if not self.max_total_bytes and not self.max_age:
            return
        sizes: list[tuple[str, int, float]] = []
        for path in part_paths(self.base):
            try:
                st = os.stat(path)
            except OSError:
                continue
            sizes.append((path, st.st_size, st.st_mtime))
        total = sum(size for _, size, _ in sizes)
        now = time.time()
        for path, size, mtime in sizes:
            if path == current:
                break
            too_old = self.max_age is not None and now - mtime > self.max_age
            too_big = self.max_total_bytes is not None and total > self.max_total_bytes
            if not (too_old or too_big):
                break
            try:
                os.unlink(path)
            except OSError as exc:
                LOG.warning("update log: cannot delete old part %s: %s", path, exc)
                break
            total -= size
            self.deleted.append(path)
            LOG.info("update log: deleted %s (%s)", path, "max_age" if too_old else "max_total_bytes")

    def append_base(self, records: list[list[Any]]) -> None:
        """The base of a part just opened (see the module docstring); not counted in its size."""
        before = len(self._buf)
        for record in records:
            payload = self._packer.pack(record)
            self._buf += FRAME.pack(len(payload), hashing.crc32(payload))
            self._buf += payload
            self.records += 1
        self._base_bytes += len(self._buf) - before
        self.rotated = False

    def append(self, record: list[Any]) -> None:
        payload = self._packer.pack(record)
        buf = self._buf
        buf += FRAME.pack(len(payload), hashing.crc32(payload))
        buf += payload
        self.records += 1
        if len(buf) >= self.buffer_bytes:
            self.flush()

    def flush(self) -> None:
        buf = self._buf
        if buf and self._file is not None:
            self._file.write(buf)
            self._size += len(buf)
            buf.clear()
            if self._size - self._base_bytes >= self.max_file_bytes:
                self._file.close()
                self._open()

    def close(self) -> None:
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            self._file.close()
            self._file = None
