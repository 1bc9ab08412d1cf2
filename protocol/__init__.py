"""The host-state protocol: wire format and the pure, sans-IO state machines.

* :mod:`protocol.messages` – message types; :mod:`protocol.codec` – msgpack
  encoding with validation and optional HMAC signatures;
* :mod:`protocol.document` – namespaced documents, canonical digest, diff/apply;
* :mod:`protocol.hostdoc` – the host document's schema (namespaces, keys, accessors);
* :mod:`protocol.resources` – the resource-fit rule both sides apply;
* :mod:`protocol.source` – the compute-node side (single writer, arbiter);
* :mod:`protocol.receiver` – the scheduler side (ordering, resync, claim ledger).

Nothing in this package performs I/O, starts a thread or reads a clock: the
edges (``transport``, ``compute_reporter``, ``shared_host_manager``,
``simulator``) feed messages and time in and carry the returned
:class:`~protocol.messages.Send` instructions out.  The wire specification is
docs/protocol.md; the contract it keeps, docs/design.md.
"""
