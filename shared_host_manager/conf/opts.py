"""``oslo.config.opts`` entry points: every option group, for oslo-config-generator.

``tox -e genconfig`` writes etc/shm.conf.sample from these namespaces, so the
sample config is the operator's manual (each option's help says what it does,
its possible values and its related options).
"""

from __future__ import annotations

from oslo_config import cfg

from shared_host_manager.conf import cache, decision


def list_scheduler_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """The scheduler side: [cache] and the decision path."""
    return [*cache.list_opts(), *decision.list_opts()]
