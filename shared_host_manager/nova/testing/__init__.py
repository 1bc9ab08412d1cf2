"""The test and simulation harness over nova: on top of the drop-in, never in a nova service.

:mod:`.fixtures`    nova objects, a cache fed from documents, a fake placement and a nova
                    database, for the tests, ``shm bench nova`` and the simulation.
:mod:`.simulation`  a whole nova cloud in one process for ``shm sim --scheduler nova``.
"""
