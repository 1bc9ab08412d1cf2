"""How a request sees sources other than the host being filtered (the ``World`` of request.py).

Two implementations answer the same questions:

* :class:`ReceiverWorld` scans the receiver's views: O(hosts) per question, used by
  the per-host slow path so that it shares nothing with the index it is compared to;
* :class:`IndexWorld` answers from the columnar index's inverted maps: O(answer).

Both are stateless read-only adapters, created per request (they are cheap) and
never write anything.  Both count our own pending claims' instances as being on
their host, as :class:`~shared_host_manager.decision.hostview.HostView` does.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.hostdoc import VOLUMES, compute_of, host_name, instances_of, is_host, namespace, volume_hosts_of
from protocol.receiver import ReceiverMachine
from shared_host_manager.decision.hostview import groups_of, pending_counts
from shared_host_manager.decision.index import HostIndex


class ReceiverWorld:
    __slots__ = ("receiver",)

    def __init__(self, receiver: ReceiverMachine) -> None:
        self.receiver = receiver

    def hosts_of_instances(self, uuids: Iterable[str]) -> list[str]:
        wanted = set(uuids)
        out: set[str] = set()
        if not wanted:
            return []
        for view in self.receiver.sources.values():
            if not is_host(view.doc):
                continue
            insts = instances_of(view.doc)
            if any(u in insts for u in wanted) or wanted.intersection(pending_counts(view)[2]):
                out.add(host_name(compute_of(view.doc), view.source))
        return sorted(out)

    def members_of_group(self, uuid: str) -> list[str]:
        return sorted(instance for view in self.receiver.sources.values() if is_host(view.doc)
                      for instance, group in groups_of(view).items() if group == uuid)

    def volume_hosts(self, volume_id: str) -> frozenset[str] | None:
        found = False
        out: set[str] = set()
        for view in self.receiver.sources.values():
            if view.doc is not None and volume_id in namespace(view.doc, VOLUMES):
                found = True
                out.update(volume_hosts_of(view.doc))
        return frozenset(out) if found else None


class IndexWorld:
    __slots__ = ("index",)

    def __init__(self, index: HostIndex) -> None:
        self.index = index

    def hosts_of_instances(self, uuids: Iterable[str]) -> list[str]:
        ix = self.index
        out = {ix.hosts[row] for uuid in uuids for row in ix.rows_of_instance(uuid)}
        return sorted(out)

    def members_of_group(self, uuid: str) -> list[str]:
        return sorted(self.index.members_of_group(uuid))

    def volume_hosts(self, volume_id: str) -> frozenset[str] | None:
        return self.index.volume_hosts(volume_id)


__all__ = ["IndexWorld", "ReceiverWorld"]
