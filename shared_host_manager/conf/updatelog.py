"""Options of the update log (group ``[update_log]``): :mod:`transport.updatelog.opts`.

They live below the reporter, which reads them too without importing this package;
the scheduler side and the ``oslo.config.opts`` entry point (``shm.updatelog =
shared_host_manager.conf.updatelog:list_opts``) name them here, beside the other
option modules.  No state of its own.
"""

from __future__ import annotations

from transport.updatelog.opts import GROUP as GROUP
from transport.updatelog.opts import list_opts as list_opts
from transport.updatelog.opts import register_opts as register_opts
from transport.updatelog.opts import update_log_opts as update_log_opts

__all__ = ["GROUP", "list_opts", "register_opts", "update_log_opts"]
