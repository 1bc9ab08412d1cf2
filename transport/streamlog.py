"""An in-memory, offset-addressed append-only log with retention.

Role: the storage behind the in-process data plane, standing in for a
RabbitMQ stream: every appended body gets the next integer offset
(contiguous, starting at 0) and keeps its publish time (the kombu stream's
``shm-ts`` header), readers address it by offset, and retention drops the
oldest entries when a count or byte limit is exceeded.
Life cycle: created empty by the bus, grows by ``append`` and shrinks from
the head by retention; it holds no threads and no locks (the owner
serialises access).
"""

from __future__ import annotations

__all__ = ["Entry", "StreamLog"]

#: one retained message: its body and its publisher's wall-clock time (None: unknown)
Entry = tuple[bytes, float | None]

# Dropped entries are only physically removed once they are at least this
# many and at least half of the list, so retention stays amortised O(1)
# while reads keep O(1) list indexing (a deque would make reads O(n)).
_COMPACT_MIN = 1024


class StreamLog:
    """Append-only log of bodies addressed by contiguous offsets."""

    __slots__ = ("_items", "_head", "_base", "_bytes",
                 "max_messages", "max_bytes", "dropped_messages")

    def __init__(self, max_messages: int | None = None,
                 max_bytes: int | None = None) -> None:
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages must be >= 1 or None")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1 or None")
        self._items: list[Entry] = []
        self._head = 0          # index in _items of the first retained entry
        self._base = 0          # offset of _items[0]
        self._bytes = 0         # bytes currently retained
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.dropped_messages = 0

    @property
    def first_offset(self) -> int:
        """Offset of the oldest retained entry (== next_offset if empty)."""
        return self._base + self._head

    @property
    def next_offset(self) -> int:
        """Offset the next appended entry will get."""
        return self._base + len(self._items)

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items) - self._head

    def append(self, body: bytes, published_at: float | None = None) -> int:
        """Append *body*, published at *published_at*, apply retention, return its offset."""
        items = self._items
        offset = self._base + len(items)
        items.append((body, published_at))
        self._bytes += len(body)
        if ((self.max_messages is not None
             and len(items) - self._head > self.max_messages)
                or (self.max_bytes is not None
                    and self._bytes > self.max_bytes)):
            self._enforce_retention()
        return offset

    def _enforce_retention(self) -> None:
        items = self._items
        head = self._head
        # The newest entry is always kept, like a stream never deletes its
        # active segment: a single oversize body must stay readable.
        last = len(items) - 1
        max_messages = self.max_messages
        max_bytes = self.max_bytes
        while head < last and (
                (max_messages is not None
                 and len(items) - head > max_messages)
                or (max_bytes is not None and self._bytes > max_bytes)):
            self._bytes -= len(items[head][0])
            head += 1
        self.dropped_messages += head - self._head
        self._head = head
        if head >= _COMPACT_MIN and head * 2 >= len(items):
            del items[:head]
            self._base += head
            self._head = 0

    def read(self, offset: int, limit: int) -> tuple[int, list[Entry]]:
        """Return ``(start, entries)``: up to *limit* ``(body, published_at)`` from *offset*.

        ``start`` is *offset*, or ``first_offset`` when retention already
        dropped *offset* (the caller detects the gap by comparing).
        """
        start = max(offset, self._base + self._head)
        index = start - self._base
        return start, self._items[index:index + limit]
