"""Writing an update log: append-only, buffered, rotating files of one party.

Life cycle of a :class:`LogWriter`::

    LogWriter(base, header)   continues after the parts already on disk (a restarted
                              process appends a new session) and opens part N+1,
                              header first
      append(record)*         into a memory buffer; written out at buffer_bytes
      flush()                 buffer -> file; a part past max_file_bytes is closed
                              and the next one opened (header again)
      close()                 last flush

Not thread-safe: the recorder serialises appends under its own lock.  No
fsync: a crash can lose the unwritten tail, which the reader reports as the
end of that session (:mod:`.reader`).  The framing is :mod:`.format`.
"""

from __future__ import annotations

import io
import os
from typing import Any

import msgpack

from protocol import hashing
from shared_host_manager.updatelog.format import (
    DEFAULT_BUFFER_BYTES,
    FRAME,
    HEADER,
    MAGIC,
    frame,
    part_paths,
)
from shared_host_manager.updatelog.reader import LogReader


class LogWriter:
    """Append-only, buffered, rotating writer of one log (not thread-safe: the recorder locks)."""

    def __init__(self, base: str, header: dict[str, Any], *, max_file_bytes: int,
                 buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        self.base = base
        self.header = dict(header)
        self.max_file_bytes = max_file_bytes
        self.buffer_bytes = buffer_bytes
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
        self.files.append(path)
        header = dict(self.header, part=self.part, first_record=self.records)
        head = MAGIC + frame(msgpack.packb([HEADER, header], use_bin_type=True))
        self._file.write(head)
        self._size = len(head)

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
            if self._size >= self.max_file_bytes:
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
