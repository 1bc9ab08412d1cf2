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


class EpochStore:
    def __init__(self, state_dir: str | None) -> None:
        self._path = os.path.join(state_dir, "epochs.json") if state_dir else None
        self._epochs: dict[str, int] = {}
        if self._path and os.path.exists(self._path):
            with open(self._path, encoding="utf-8") as f:
                self._epochs = {str(k): int(v) for k, v in json.load(f).items()}

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
        os.replace(tmp, self._path)
