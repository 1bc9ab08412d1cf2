"""``shm sim --cells C --cell-outage CELL:START:SECONDS``: one cell's broker away for a while.

Over RabbitMQ every cell stream lives on the local broker; the cell named goes through a
:class:`~simulator.relay.Relay` (its reporters and every scheduler reach its stream through
it), which this stops ``START`` seconds into the measured run and starts again
``SECONDS`` later, as that cell's broker would fail and return (design §4.6).

What it measures, beside the run's own figures (0 overcommitted hosts, converged):

* requests scheduled per second while the cell is away, and on which cell's hosts they
  landed: once ``down_interval`` has passed the cell's hosts are down in every view, so
  none should land there (``outage_placed_on_cell_after_down``);
* how long after the broker's return every scheduler holds every host of the cell at the
  version its reporter had published by then (``outage_rejoin_s``: from the cell stream's
  offset, the changes published meanwhile and the heartbeats).

Life cycle::

    CellOutage(spec, cells) --begin(run)--> waiting --START--> cell away
        --SECONDS--> back --every view current on the cell's hosts--> rejoined
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

__all__ = ["CellOutage", "parse"]


class Stoppable(Protocol):
    """What the outage needs of the cell's relay."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def parse(spec: str, cells: int) -> tuple[str, float, float]:
    """``CELL:START:SECONDS`` -> (cell, start, seconds); a ValueError says what is wrong."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"--cell-outage {spec!r}: expected CELL:START:SECONDS, e.g. cell2:10:30")
    cell, start_text, seconds_text = parts
    names = [f"cell{c + 1}" for c in range(cells)]
    if cell not in names:
        raise ValueError(f"--cell-outage {spec!r}: {cell!r} is not one of the run's cells "
                         f"({', '.join(names) or 'none: add --cells C'})")
    try:
        start, seconds = float(start_text), float(seconds_text)
    except ValueError:
        raise ValueError(f"--cell-outage {spec!r}: START and SECONDS are seconds") from None
    if start < 0 or seconds <= 0:
        raise ValueError(f"--cell-outage {spec!r}: START must be >= 0 and SECONDS > 0")
    return cell, start, seconds


class CellOutage:
    """One cell's broker stopped and started during the measured run; see the module
    docstring.  ``relay`` is the cell's (set by the run's transport)."""

    def __init__(self, spec: str, cells: int, down_interval: float) -> None:
        self.cell, self.start, self.seconds = parse(spec, cells)
        self.down_interval = down_interval
        self.relay: Stoppable | None = None
        #: the hosts of the cell (set as the reporters are made)
        self.sources: set[str] = set()
        self._lock = threading.Lock()
        self._away: float | None = None
        self._back: float | None = None
        self._rejoined: float | None = None
        self._placed = {"cell": 0, "cell_after_down": 0, "elsewhere": 0}
        self._scheduled_away = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, published: Callable[[], Mapping[str, tuple[int, int]]],
              views: Callable[[], Sequence[Mapping[str, tuple[tuple[int, int], bytes | None]]]],
              ) -> None:
        """Start the outage's clock at the measured run's start; ``published`` reads each
        source's published version, ``views`` every scheduler's view."""
        self._thread = threading.Thread(target=self._run, args=(published, views),
                                        name="cell-outage", daemon=True)
        self._thread.start()

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._away is not None and self._back is None and self.relay is not None:
            self.relay.start()  # the run ended first: the broker comes back for the rest

    def placed(self, sources: list[str]) -> None:
        """Hosts just chosen for a scheduled request (the run's outcome hook)."""
        now = time.monotonic()
        with self._lock:
            if self._away is None or (self._back is not None and now >= self._back):
                return
            self._scheduled_away += 1
            for source in sources:
                if source in self.sources:
                    self._placed["cell"] += 1
                    if now >= self._away + self.down_interval:
                        self._placed["cell_after_down"] += 1
                else:
                    self._placed["elsewhere"] += 1

    def figures(self) -> dict[str, object]:
        with self._lock:
            away = None if self._away is None else \
                (self._back if self._back is not None else time.monotonic()) - self._away
            return {
                "outage_cell": self.cell,
                "outage_cell_hosts": len(self.sources),
                "outage_seconds": None if away is None else round(away, 1),
                "outage_scheduled_per_s": None if not away else
                round(self._scheduled_away / away, 2),
                "outage_placed_elsewhere": self._placed["elsewhere"],
                "outage_placed_on_cell": self._placed["cell"],
                "outage_placed_on_cell_after_down": self._placed["cell_after_down"],
                "outage_rejoin_s": None if self._rejoined is None or self._back is None else
                round(self._rejoined - self._back, 2),
            }

    def _run(self, published: Callable[[], Mapping[str, tuple[int, int]]],
             views: Callable[[], Sequence[Mapping[str, tuple[tuple[int, int], bytes | None]]]],
             ) -> None:
        assert self.relay is not None, "the run's transport made no relay for the cell"
        if self._stop.wait(self.start):
            return
        self.relay.stop()
        with self._lock:
            self._away = time.monotonic()
        if self._stop.wait(self.seconds):
            return
        self.relay.start()
        with self._lock:
            self._back = time.monotonic()
        target = {s: v for s, v in published().items() if s in self.sources}
        while not self._stop.wait(0.25):
            if all(all(view.get(s, ((-1, -1), None))[0] >= v for s, v in target.items())
                   for view in views()):
                with self._lock:
                    self._rejoined = time.monotonic()
                return
