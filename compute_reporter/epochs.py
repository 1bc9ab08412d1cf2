"""Persisted epochs: every restart of a source must be newer than the last.

The reporter keeps ``{source: epoch}`` in ``<state_dir>/epochs.json`` and
writes it (atomically: temp file + rename) before announcing a new epoch, so a
restart whose wall clock went backwards still announces a newer epoch
(:func:`protocol.source.next_epoch`).  Without a state dir, the wall clock
alone orders epochs.

The contract: docs/design.md §3.
"""

from __future__ import annotations

import json
import os
import tempfile

from protocol.source import next_epoch
from transport.startup import OperatorError, check_state_dir


class EpochStore:
    """Raises :class:`~transport.startup.OperatorError` (one line, naming the path) when the
    state directory cannot be written or the epochs file cannot be read."""

    def __init__(self, state_dir: str | None) -> None:
        self._path = os.path.join(state_dir, "epochs.json") if state_dir else None
        self._epochs: dict[str, int] = {}
        if state_dir:
            check_state_dir(state_dir, "[reporter] state_dir")
        if self._path and os.path.exists(self._path):
            try:
                with open(self._path, encoding="utf-8") as f:
                    data = json.load(f)
                self._epochs = {str(k): int(v) for k, v in data.items()}
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                raise OperatorError(
                    f"[reporter] state_dir: the epochs file {self._path} is unreadable ({exc}); "
                    "move it away to start over with epochs from the wall clock (safe unless this "
                    "host's clock went backwards since the last start)") from exc

    def new_epochs(self, sources: list[str], wall_ns: int) -> dict[str, int]:
        """Allocate and persist a new epoch for each source."""
        for source in sources:
            self._epochs[source] = next_epoch(self._epochs.get(source), wall_ns)
        self._save()
        return {s: self._epochs[s] for s in sources}

    def _save(self) -> None:
        if not self._path:
            return
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self._path), prefix=".epochs-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self._epochs, f)
            # on disk before the rename: else a power cut can leave an empty epochs file,
            # and the next start refuses to run until an operator moves it away
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
