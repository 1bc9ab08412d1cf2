"""VolumeLocalityFilter: hint ``near_volume=<volume id>``: only hosts local to that volume's backend.

Cross-project affinity through the same stream: a volume backend is a source
like a compute node; its document has a ``volumes`` namespace (the volumes it
holds) and a ``locality`` namespace (``hosts``: the compute hosts that reach
it locally).  The filter finds the backend source(s) holding the volume and
passes only their local hosts; with several volumes in the hint, a host must
be local to all of them.  A volume no source holds fails every host: the
locality was asked for and cannot be shown.
"""

from __future__ import annotations

from shared_host_manager.decision.filters import BaseHostFilter, utils
from shared_host_manager.decision.hostview import HostView
from shared_host_manager.decision.index import PASS_ALL, HostIndex, Only, VectorResult
from shared_host_manager.decision.request import RequestView


class VolumeLocalityFilter(BaseHostFilter):
    """Schedule the instance on a host local to the requested volume's backend."""

    run_filter_once_per_request = True
    HINT = "near_volume"

    def active(self, spec_obj: RequestView) -> bool:
        return bool(spec_obj.get_scheduler_hint(self.HINT))

    def _allowed(self, spec_obj: RequestView) -> frozenset[str] | None:
        volumes = utils.hint_list(spec_obj.get_scheduler_hint(self.HINT))
        if not volumes:
            return None

        def compute() -> frozenset[str]:
            allowed: frozenset[str] | None = None
            for volume in volumes:
                hosts = spec_obj.world.volume_hosts(volume) or frozenset()
                allowed = hosts if allowed is None else allowed & hosts
            return allowed or frozenset()

        return spec_obj.memo(self.name, compute)

    def host_passes(self, host_state: HostView, spec_obj: RequestView) -> bool:
        allowed = self._allowed(spec_obj)
        return allowed is None or host_state.host in allowed

    def vector(self, index: HostIndex, spec_obj: RequestView) -> VectorResult | None:
        allowed = self._allowed(spec_obj)
        if allowed is None:
            return PASS_ALL
        return Only(index.rows_of_hosts(sorted(allowed)))
