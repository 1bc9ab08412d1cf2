"""The update log's files, shared by every party that records one.

Role: what a reporter's update log and a scheduler's have in common -- the
files, frames and record kinds (:mod:`.format`), the buffered rotating writer
(:mod:`.writer`), the reader (:mod:`.reader`) and the ``[update_log]`` options
(:mod:`.opts`) -- below the reporter, so that ``shm reporter`` records its log
without importing the scheduler package.  The recorders are the parties' own:
:mod:`compute_reporter.recorder` for a reporter, :mod:`shared_host_manager.updatelog.recorder`
for a scheduler (and any party of an in-process run); replay and diff are the
scheduler side's.

Life cycle: importing this package opens nothing; a writer's files are opened by
the recorder that owns it.
"""
