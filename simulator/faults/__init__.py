"""Deterministic fault simulation of the whole system (``shm faults``, design §6).

The real reporter (:class:`~compute_reporter.manager.ReporterManager` and its
source machines, persisted epochs), the real scheduler edge
(:class:`~shared_host_manager.cache.HostStateCache` over the receiver, with its
persisted state file) and the real decision and claim code
(:class:`~shared_host_manager.decision.engine.DecisionEngine`,
:class:`~shared_host_manager.decision.request_tracker.RequestTracker`) run over a
simulated stream and control plane in virtual time, one seeded schedule of
faults at a time (:mod:`.world`), with the design's invariants checked after
every step (:mod:`.invariants`).  :mod:`.run` runs many schedules, or replays one
with every party's update log written.
"""
