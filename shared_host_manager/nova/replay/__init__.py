"""The drop-in's recorded decisions re-run through its own code (``shm replay --decisions``).

On top of the drop-in: :mod:`.steps` reads the steps :mod:`shared_host_manager.nova.decision_log`
wrote and runs them through :class:`~shared_host_manager.nova.host_manager.SharedHostManager`.
"""
