"""Reading an update log: :mod:`transport.updatelog.reader`, under the scheduler side's name.

The reader lives below the reporter with the writer it serves (a writer continues
the numbering of the parts already on disk), so that a reporter process imports
nothing of this package; replay, diff and ``shm replay`` name it here, beside the
rest of the update log.  No state of its own.
"""

from __future__ import annotations

from transport.updatelog.reader import BadRecord as BadRecord
from transport.updatelog.reader import Damage as Damage
from transport.updatelog.reader import LogReader as LogReader
from transport.updatelog.reader import Record as Record
from transport.updatelog.reader import find_logs as find_logs
from transport.updatelog.reader import resolve_log as resolve_log

__all__ = ["BadRecord", "Damage", "LogReader", "Record", "find_logs", "resolve_log"]
