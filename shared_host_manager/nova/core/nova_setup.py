"""nova's objects registered and an empty nova configuration parsed, once per process.

What every nova filter and weigher class needs to run outside a nova service: the
engine's core (:mod:`.plugins`, for the simulator, replay and the benchmarks) and the
test harness (:mod:`shared_host_manager.nova.testing.fixtures`) start here.  Never
called in a nova service, whose own start does the same.
"""

from __future__ import annotations

import threading
from typing import Any

from oslo_utils import importutils

_setup_lock = threading.Lock()
_objects_done = False


def setup_nova_objects() -> Any:
    """Register nova's objects and parse an empty nova configuration (once per process): all
    nova's filter and weigher classes need, without the RPC layer (whose import brings
    eventlet in).  Returns nova's CONF."""
    global _objects_done
    import nova.conf
    from nova import objects

    conf = nova.conf.CONF
    with _setup_lock:
        if not _objects_done:
            objects.register_all()
            # as nova.config.parse_args: where osprofiler is installed (as in many nova
            # deployments) nova's database layer reads [profiler], registered only here
            profiler_opts = importutils.try_import("osprofiler.opts")
            if profiler_opts is not None:
                profiler_opts.set_defaults(conf)
            conf([], project="nova", default_config_files=[], default_config_dirs=[])
            _objects_done = True
    return conf



__all__ = ["setup_nova_objects"]
