"""Reading an update log: its records in order, and where (if anywhere) it is damaged.

:class:`LogReader` walks the parts of one log (``<base>.0001``, ...), checks
each file's magic and each record's frame, checksum and shape (the shapes
are :data:`.format.RECORD_SHAPES`), and yields :class:`Record` objects
numbered across parts.  It stops at the first record it cannot read and
describes it as :class:`Damage` (file, byte offset, record index, reason);
damage at the end of a session that a later file continues (a crash, then a
restart) only ends that session.  Nothing in a file can make it raise.

:func:`resolve_log` and :func:`find_logs` turn what a user typed (a base path,
a part, a directory) into the parts to read.
"""

from __future__ import annotations

import glob
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from transport.updatelog import format as fmt
from transport.updatelog.format import (
    CHECKPOINT,
    FRAME,
    HEADER,
    KIND_NAMES,
    MAGIC,
    MAX_RECORD_BYTES,
    OPT_NUM,
    RECORD_OPTIONAL,
    RECORD_SHAPES,
    SUFFIX,
)


@dataclass(slots=True)
class Damage:
    """Where a log stopped being readable: ``record`` is the index of the first record lost."""

    path: str
    offset: int
    record: int
    reason: str
    #: True when a later file (a new session) was read after it
    resumed: bool = False

    def describe(self) -> str:
        return (f"{self.path}: damaged at byte {self.offset} (record {self.record}): {self.reason}"
                + ("; resumed with the next session" if self.resumed else ""))


@dataclass(slots=True)
class Record:
    index: int
    kind: int
    now: Any
    fields: list[Any]
    path: str
    offset: int

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, str(self.kind))










class BadRecord(Exception):
    pass


def _check_shape(rec: Any) -> None:
    if type(rec) is not list or len(rec) < 2 or type(rec[0]) is not int:
        raise BadRecord("not a record (expected [kind, now, ...])")
    shape = RECORD_SHAPES.get(rec[0])
    if shape is None:
        raise BadRecord(f"unknown record kind {rec[0]}")
    if not isinstance(rec[1], OPT_NUM) or type(rec[1]) is bool:
        raise BadRecord(f"{KIND_NAMES[rec[0]]} record: clock value is {type(rec[1]).__name__}")
    if len(rec) < 2 + len(shape):
        raise BadRecord(f"{KIND_NAMES[rec[0]]} record has {len(rec)} fields, expected {2 + len(shape)}")
    for i, types in enumerate(shape):
        if not isinstance(rec[2 + i], types):
            raise BadRecord(f"{KIND_NAMES[rec[0]]} record: field {i + 2} is {type(rec[2 + i]).__name__}")
    at = 2 + len(shape)
    for types in RECORD_OPTIONAL.get(rec[0], ()):
        if len(rec) > at and type(rec[at]) is not dict:
            if not isinstance(rec[at], types) or type(rec[at]) is bool:
                raise BadRecord(f"{KIND_NAMES[rec[0]]} record: field {at} is {type(rec[at]).__name__}")
            at += 1
    if len(rec) > at and rec[0] not in (CHECKPOINT,):
        if type(rec[at]) is not dict:
            raise BadRecord(f"{KIND_NAMES[rec[0]]} record: effects must be a map")


def _frame_at(data: bytes, pos: int) -> tuple[Any, int]:
    left = len(data) - pos
    if left < FRAME.size:
        raise BadRecord(f"truncated record frame ({left} bytes left)")
    length, crc = FRAME.unpack_from(data, pos)
    if length > MAX_RECORD_BYTES:
        raise BadRecord(f"implausible record length {length}")
    end = pos + FRAME.size + length
    if end > len(data):
        raise BadRecord(f"truncated record: {length} bytes announced, {left - FRAME.size} left")
    payload = memoryview(data)[pos + FRAME.size:end]
    if zlib.crc32(payload) != crc:
        raise BadRecord("checksum mismatch")
    try:
        rec = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 — any unpack failure is damage
        raise BadRecord(f"undecodable record: {type(exc).__name__}") from None
    return rec, end


def _read_header(data: bytes, path: str) -> tuple[dict[str, Any], int]:
    if data[:len(MAGIC)] != MAGIC:
        raise BadRecord("not an update log (bad magic)" if len(data) >= len(MAGIC) else "truncated magic")
    rec, end = _frame_at(data, len(MAGIC))
    if type(rec) is not list or len(rec) != 2 or rec[0] != HEADER or type(rec[1]) is not dict:
        raise BadRecord("first record is not a header")
    header = rec[1]
    if header.get("format") not in fmt.READABLE_FORMATS:
        raise BadRecord(f"unsupported log format {header.get('format')!r}")
    for key, types in (("role", str), ("name", str), ("session", str)):
        if type(header.get(key)) is not types:
            raise BadRecord(f"header field {key!r} missing")
    if not isinstance(header.get("config", {}), dict):
        raise BadRecord("header field 'config' is not a map")
    return header, end


class LogReader:
    """The records of one log (its parts in order); stops at damage, see the module docstring."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        self.headers: list[dict[str, Any]] = []
        self.damages: list[Damage] = []
        self.bytes = 0

    @property
    def damage(self) -> Damage | None:
        """The damage that ended the log (None if it was read to its end)."""
        return self.damages[-1] if self.damages and not self.damages[-1].resumed else None

    def _next_session(self, i: int, session: str | None) -> bool:
        """Whether file ``i`` exists and starts a session other than ``session``."""
        if i >= len(self.paths):
            return False
        try:
            with open(self.paths[i], "rb") as f:
                header, _ = _read_header(f.read(1 << 20), self.paths[i])
        except (OSError, BadRecord):
            return False
        return header["session"] != session

    def __iter__(self) -> Iterator[Record]:
        index = 0
        session: str | None = None
        for i, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                self.damages.append(Damage(path, 0, index, f"unreadable: {exc}"))
                return
            self.bytes += len(data)
            try:
                header, pos = _read_header(data, path)
            except BadRecord as exc:
                self.damages.append(Damage(path, 0, index, str(exc)))
                return
            first = header.get("first_record")
            if header["session"] == session:
                if type(first) is int and first != index:
                    self.damages.append(Damage(path, 0, index, f"file starts at record {first}, "
                                               f"expected {index}: a part is missing"))
                    return
            elif type(first) is int and first >= 0:
                index = first
            session = header["session"]
            self.headers.append(header)
            yield Record(-1, HEADER, header.get("clock"), [header], path, 0)
            while pos < len(data):
                try:
                    rec, end = _frame_at(data, pos)
                    _check_shape(rec)
                except BadRecord as exc:
                    resumed = self._next_session(i + 1, session)
                    self.damages.append(Damage(path, pos, index, str(exc), resumed))
                    if resumed:
                        break
                    return
                yield Record(index, rec[0], rec[1], rec[2:], path, pos)
                index += 1
                pos = end


def resolve_log(arg: str) -> list[str]:
    """The files of the log named by ``arg``: one part, or a base path (all its parts)."""
    if os.path.isfile(arg):
        return [arg]
    parts = fmt.part_paths(arg)
    if not parts and not arg.endswith(SUFFIX):
        parts = fmt.part_paths(arg + SUFFIX)
    return parts


def find_logs(directory: str) -> dict[str, list[str]]:
    """Every log in ``directory``: base path -> parts."""
    out: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), f"*{SUFFIX}.*"))):
        m = re.fullmatch(r"(.*)\.(\d{4,})", path)
        if m:
            out.setdefault(m.group(1), [])
    return {base: fmt.part_paths(base) for base in out}
