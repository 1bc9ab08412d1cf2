"""nova 34 (2026.2) integration: a drop-in host manager fed by the host-state stream.

This package is the only place in the project that imports nova.  Nothing
outside it may import nova, and the rest of the project reaches this package
only from the simulator's nova commands (``shm bench nova``, ``shm sim
--scheduler nova``), at call time, so the core runs where nova is not installed.

Parts
-----
Four parts, whose imports run one way (``tests/test_layout.py``): the core at the
bottom, the drop-in on it, replay and the test harness on the drop-in.

``core/``             the decision core: :mod:`.core.document` (how a nova ComputeNode
                      travels as a host document and back), :mod:`.core.template`
                      (a document as nova's objects, per source version),
                      :mod:`.core.host_state` (one host for one request, nova's
                      HostState), :mod:`.core.vector` (nova's filters and weighers
                      over the request's hosts as arrays, with nova's exact results),
                      :mod:`.core.index_table` (the engine's index as their host
                      table), :mod:`.core.plugins` (nova's classes as the engine's
                      plugins), :mod:`.core.nova_setup` (nova's objects outside a
                      nova service).
this package          the drop-in a deployment runs: :mod:`.host_manager`
                      (:class:`SharedHostManager`, the ``HostManager`` subclass that
                      serves nova's SchedulerManager from the shared cache),
                      :mod:`.compute_hook` (the ResourceTracker hook on nova-compute),
                      :mod:`.api_source` and :mod:`.api_publisher` (the nova-api /
                      nova-conductor side: service state, deletions, aggregates as a
                      source of their own, design §2), :mod:`.row_entries` (each
                      source's request row, kept until it changes),
                      :mod:`.decision_log` (the drop-in's steps in the update log),
                      :mod:`.conf` (``[shared_host_manager]``), :mod:`.cmd`
                      (``nova-scheduler-shared``, ``nova-compute-shared``,
                      ``nova-conductor-shared``), ``wsgi/`` (nova-api), and
                      :class:`~.fixtures.SharedHostManagerFixture`, the drop-in wired
                      into an in-process nova (nova's functional tests).
``replay/``           :mod:`.replay.steps`: the recorded steps re-run through the
                      drop-in's own code (``shm replay --decisions``).
``testing/``          :mod:`.testing.fixtures` (nova objects, a cache fed from
                      documents, a fake placement and a nova database, for the tests,
                      ``shm bench nova`` and the simulation) and
                      :mod:`.testing.simulation` (a whole nova cloud in one process for
                      ``shm sim --scheduler nova``).
"""
