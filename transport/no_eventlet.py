"""Keep eventlet out of the process before oslo.messaging is imported.

Role: the project runs on threads only (eventlet is deprecated upstream
and oslo.messaging's eventlet executor is scheduled for removal;
docs/design.md §9.1), yet with eventlet merely *installed*,
``import oslo_messaging`` imports it twice over: ``futurist`` tries
``import eventlet`` for its green executors, and ``oslo_messaging.server``
imports ``oslo_service.service``, whose default backend is eventlet.
``install()`` makes ``import eventlet`` fail with ImportError (both
libraries then fall back to threads) and selects oslo.service's threading
backend.

Life cycle: ``install()`` runs once, at import of this module, which
``transport.oslo_rpc`` imports before oslo.messaging. It is idempotent and
process-wide by design. A process entry point that imports
oslo.messaging elsewhere should import this module first.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["install"]

LOG = logging.getLogger(__name__)


def install() -> None:
    """Block eventlet and choose oslo.service's threading backend."""
    loaded = sys.modules.get("eventlet")
    if loaded is not None:
        # The operator chose [DEFAULT] concurrency_backend = eventlet, and the
        # entry point imported and monkey-patched it first: leave it in charge.
        LOG.info("eventlet already imported: keeping the eventlet backend")
        return
    else:
        # A None entry makes every later `import eventlet` raise
        # ImportError, which futurist and oslo.utils treat as "absent".
        # (typeshed types sys.modules as dict[str, ModuleType]: None is the documented exception)
        sys.modules["eventlet"] = None  # type: ignore[assignment]

    from oslo_service import backend

    if backend.get_backend_type() is None:
        backend.init_backend(backend.BackendType.THREADING)
    elif backend.get_backend_type() is not backend.BackendType.THREADING:
        LOG.warning("oslo.service backend is %s, not threading",
                    backend.get_backend_type())


install()
