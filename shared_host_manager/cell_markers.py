"""catch_up's marker on the cells' streams, put there without waiting (design §4.6).

A scheduler's ``catch_up`` puts its own entry on the deployment's stream and, with
cells, on every cell stream, then waits until each has come back.  A publish on a cell
stream whose broker has just gone away retries for up to ``publish_timeout``
(30 s): done by the deciding thread, or under the lock the timer thread takes to put
the scheduler's entry on the stream, that stalled every decision and every tick of
the scheduler for one cell's outage.  So each cell has a thread of its own that
publishes the newest marker handed to it; a marker not yet published when a newer
one comes is replaced (only the newest matters: the waiter waits for a version at
least its own), and a cell whose publish hangs holds up no one but that thread.

Life cycle::

    CellMarkers(publishers) --start()--> running --put(body, cells)--> published by
        each cell's thread, newest first --stop()--> stopped (publishers closed)
"""

from __future__ import annotations

import logging
import threading

from transport.base import StreamPublisher

__all__ = ["CellMarkers"]

LOG = logging.getLogger(__name__)


class _Cell:
    def __init__(self, name: str, publisher: StreamPublisher) -> None:
        self.name = name
        self.publisher = publisher
        self.pending: bytes | None = None
        self.wake = threading.Condition()
        self.stopped = False
        self.thread: threading.Thread | None = None


class CellMarkers:
    """One publishing thread per cell stream; see the module docstring."""

    def __init__(self, owner: str, publishers: dict[str, StreamPublisher]) -> None:
        self.owner = owner
        self._cells = {name: _Cell(name, p) for name, p in publishers.items()}
        #: markers published, and given up (the publish raised), per cell
        self.published: dict[str, int] = dict.fromkeys(publishers, 0)
        self.failed: dict[str, int] = dict.fromkeys(publishers, 0)

    def start(self) -> None:
        for cell in self._cells.values():
            cell.thread = threading.Thread(target=self._run, args=(cell,), daemon=True,
                                           name=f"scheduler-{self.owner}-marker-{cell.name}")
            cell.thread.start()

    def put(self, body: bytes, cells: tuple[str, ...]) -> None:
        """Publish ``body`` on the streams of ``cells``, from their threads; returns at once."""
        for name in cells:
            cell = self._cells[name]
            with cell.wake:
                cell.pending = body
                cell.wake.notify()

    def stop(self) -> None:
        """Stop the threads (a publish under way is left to finish) and close the publishers."""
        for cell in self._cells.values():
            with cell.wake:
                cell.stopped = True
                cell.wake.notify()
        for cell in self._cells.values():
            if cell.thread is not None:
                cell.thread.join(timeout=1.0)
            cell.publisher.close()

    def _run(self, cell: _Cell) -> None:
        while True:
            with cell.wake:
                while cell.pending is None and not cell.stopped:
                    cell.wake.wait()
                body, cell.pending = cell.pending, None
                if cell.stopped or body is None:
                    return
            try:
                cell.publisher.publish(body)
                self.published[cell.name] += 1
            except Exception as exc:  # catch_up stops waiting at its timeout
                self.failed[cell.name] += 1
                LOG.warning("scheduler %s could not put its marker on cell %s's stream: %s",
                            self.owner, cell.name, exc)
