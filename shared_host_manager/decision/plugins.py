"""Loading filters and weighers by name: stevedore entry points, with a built-in fallback.

Role: turn ``enabled_filters`` / ``weight_classes`` names into instances.
Names are looked up first in the entry point groups (so a third-party package
adds a filter by declaring an entry point, and may shadow a built-in one), then
in the in-module tables :data:`~shared_host_manager.decision.filters.BUILTIN_FILTERS` /
:data:`~shared_host_manager.decision.weights.BUILTIN_WEIGHERS` — which is what makes a
source tree without ``pip install -e .`` work (tests, benchmarks).

Entry point groups (setup.py ``entry_points``)::

    shm.scheduler.filters   = <Name> = <module>:<class>
    shm.scheduler.weighers  = <Name> = <module>:<class>
    shm.scheduler.cores     = <name> = <module>:<function>

A *core* loads the filters and weighers of a whole configuration at once
(``[filter_scheduler] decision_core``), by entry point only: ``nova``
(``shared_host_manager.nova.core.plugins:load_core``, a layer above this one:
reached by name, never imported) gives nova's own class for every name nova
has one for, sharing state between the filters and weighers of one engine, and
loads the other names through :func:`load_filters` / :func:`load_weighers`.

Life cycle: called once when an engine is built; nothing is cached here
(stevedore keeps its own entry point cache).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision.filters import BUILTIN_FILTERS, BaseHostFilter
from shared_host_manager.decision.weights import BUILTIN_WEIGHERS, BaseHostWeigher

LOG = logging.getLogger(__name__)

FILTER_NAMESPACE = "shm.scheduler.filters"
WEIGHER_NAMESPACE = "shm.scheduler.weighers"
CORE_NAMESPACE = "shm.scheduler.cores"

#: a core: config -> (filters, weighers) for its enabled_filters and weight_classes
Core = Callable[[SchedulerConfig], tuple[list[BaseHostFilter], list[BaseHostWeigher]]]


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _from_entry_points(namespace: str, names: list[str]) -> dict[str, type]:
    try:
        from stevedore import named
    except ImportError:  # pragma: no cover - stevedore is a hard dependency; be lenient anyway
        return {}
    try:
        manager: named.NamedExtensionManager[object] = named.NamedExtensionManager(
            namespace, names=names, invoke_on_load=False, name_order=True,
            on_missing_entrypoints_callback=lambda missing: None,
            on_load_failure_callback=lambda mgr, ep, exc: LOG.warning(
                "cannot load %s plugin %s: %s", namespace, ep.name, exc))
    except Exception as exc:  # a broken installation must not hide the built-ins
        LOG.warning("entry point scan of %s failed: %s", namespace, exc)
        return {}
    return {ext.name: ext.plugin for ext in manager}


def load_classes(namespace: str, names: Iterable[str], builtin: Mapping[str, str]) -> list[type]:
    """Classes for ``names``, in order: entry point first, then the built-in table."""
    names = list(names)
    found = _from_entry_points(namespace, names)
    out: list[type] = []
    for name in names:
        cls = found.get(name)
        if cls is None:
            target = builtin.get(name)
            if target is None:
                known = sorted(set(builtin) | set(found))
                raise ValueError(f"unknown {namespace} plugin {name!r}; known: {', '.join(known)}")
            cls = _import(target)
        out.append(cls)
    return out


def load_filters(names: Iterable[str], config: SchedulerConfig) -> list[BaseHostFilter]:
    return [cls(config) for cls in load_classes(FILTER_NAMESPACE, names, BUILTIN_FILTERS)]


def load_weighers(names: Iterable[str], config: SchedulerConfig) -> list[BaseHostWeigher]:
    return [cls(config) for cls in load_classes(WEIGHER_NAMESPACE, names, BUILTIN_WEIGHERS)]


def entry_point_lines() -> dict[str, list[str]]:
    """The setup.py ``entry_points`` lines for the built-ins (kept in sync with the tables)."""
    def lines(table: Mapping[str, str]) -> list[str]:
        return [f"{name} = {target}" for name, target in table.items()]

    tables = {FILTER_NAMESPACE: BUILTIN_FILTERS, WEIGHER_NAMESPACE: BUILTIN_WEIGHERS}
    return {group: lines(table) for group, table in tables.items() if table}


def load_core(config: SchedulerConfig) -> tuple[list[BaseHostFilter], list[BaseHostWeigher]]:
    """The filters and weighers of ``config``, as its ``decision_core`` loads them (a fresh
    set per call: one engine's)."""
    name = config.decision_core
    core: Core | None = _from_entry_points(CORE_NAMESPACE, [name]).get(name)
    if core is None:  # not declared, or its module does not import (logged by the scan)
        raise ValueError(f"decision_core = {name} cannot be loaded (no {CORE_NAMESPACE} entry "
                         "point of that name loads); for nova: pip install "
                         "'shared-host-manager[sim]' (or [nova])")
    return core(config)


__all__ = ["CORE_NAMESPACE", "FILTER_NAMESPACE", "WEIGHER_NAMESPACE",
           "entry_point_lines", "load_classes", "load_core", "load_filters", "load_weighers"]
