"""nova 34 (2026.2) integration: a drop-in host manager fed by the host-state stream.

This package is the only place in the project that imports nova.  Nothing
outside it may import nova, and the rest of the project reaches this package
only from the simulator's nova commands (``shm bench nova``, ``shm sim
--scheduler nova``), at call time, so the core runs where nova is not installed.

Modules
-------
:mod:`.document`      how a nova ComputeNode travels as a host document
                      (namespaces, NUMA/PCI/metrics primitives) and how the
                      nova objects are rebuilt from it.
:mod:`.host_manager`  :class:`SharedHostManager`, the ``HostManager``
                      subclass that serves nova's SchedulerManager from the
                      shared cache, and its per-request :class:`SharedHostState`.
:mod:`.vector`        the decision core: nova's filters and weighers over the
                      request's hosts as arrays, with nova's exact results.
:mod:`.compute_hook`  the nova-compute side: ResourceTracker hook that turns
                      ComputeNodes into document ops once a tracker change is
                      complete; one hook per compute host in a process.
:mod:`.api_source`    the nova-api / nova-conductor side: service state,
                      service and node deletions and aggregates as a source
                      of their own (design §2), and its merge for schedulers.
:mod:`.conf`          the ``[shared_host_manager]`` options in nova's config.
:mod:`.cmd`           ``nova-scheduler-shared`` / ``nova-compute-shared``.
:mod:`.simulation`    a whole nova cloud in one process (placement, nova's
                      databases, SchedulerManagers, computes) for ``shm sim
                      --scheduler nova``.
:mod:`.fixtures`      nova objects, a cache fed from documents, a fake placement
                      and a nova database, for the tests, ``shm bench nova``
                      (simulator/bench_nova.py) and the simulation;
                      :class:`~.fixtures.SharedHostManagerFixture`, the drop-in
                      wired into an in-process nova (nova's functional tests).
"""
