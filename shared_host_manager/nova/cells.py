"""A host-state stream per nova cell, found from nova's own cell mappings (design §4.6).

With ``[shared_host_manager] cell_streams`` in nova.conf nothing about the cells is written
twice: a compute publishes on the stream named after its ``[shared_host_manager]
cell_uuid``, on its own ``[data_plane] stream_url`` (its cell's broker); a scheduler reads,
when it starts (never on the decision path), nova's cell mappings from the API database,
and reads the stream of every cell but cell0, ``<stream_name>.<cell uuid>``, on the broker
of ``[data_plane:<cell uuid>] stream_url`` if the stream's file names one, else on the cell
mapping's own message queue (its ``transport_url``, as a kombu URL); and it reaches the
cell's computes (resync requests) and hears them on ``[data_plane:<cell uuid>]
transport_url``, else on that same message queue, where the computes of the cell listen
(their ``[control_plane] transport_url``).  ``[data_plane] cells`` set in the file wins: the
mappings are then not read.  A cell mapped later is read from the scheduler's next start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from transport.opts import cell_group, register_cell_groups
from transport.startup import OperatorError

__all__ = ["CellMapping", "apply_cell_mappings", "compute_cell", "kombu_url"]

#: nova's cell0 (objects.CellMapping.CELL0_UUID): instances that failed to schedule, no host
CELL0_UUID = "00000000-0000-0000-0000-000000000000"


class CellMapping(Protocol):
    """What is read of nova's ``objects.CellMapping``."""

    uuid: str
    transport_url: str | None


def kombu_url(transport_url: str) -> str:
    """An oslo.messaging ``rabbit://`` transport URL as the kombu URL of the same broker(s):
    ``rabbit://u:p@h1:5672,u:p@h2:5672/vh`` -> ``amqp://u:p@h1:5672/vh;amqp://u:p@h2:5672/vh``
    (kombu's fail-over list); the query (oslo's options) is dropped."""
    parts = urlsplit(transport_url)
    if parts.scheme not in ("rabbit", "amqp"):
        raise OperatorError(f"cell transport_url {parts.scheme}://...: only rabbit:// cells can "
                            f"carry a host-state stream")
    vhost = parts.path or "/"
    return ";".join(f"amqp://{host}{vhost}" for host in parts.netloc.split(","))


def apply_cell_mappings(conf: Any, mappings: Iterable[CellMapping]) -> list[str]:
    """Read the stream of every mapped cell but cell0 (``[data_plane] cells`` = their uuids),
    each on its ``[data_plane:<uuid>] stream_url`` or else its mapping's broker, and reach its
    computes on ``[data_plane:<uuid>] transport_url`` or else that broker; the cells read.
    ``[data_plane] cells`` already set: left as it is."""
    if conf.data_plane.cells:
        return list(conf.data_plane.cells)
    cells = {m.uuid: m.transport_url for m in mappings if m.uuid != CELL0_UUID}
    conf.set_override("cells", list(cells), group="data_plane")
    register_cell_groups(conf)
    for uuid, url in cells.items():
        group = conf[cell_group(uuid)]
        if not group.stream_url and url:
            conf.set_override("stream_url", kombu_url(url), group=cell_group(uuid))
        if not group.transport_url and url:
            conf.set_override("transport_url", url, group=cell_group(uuid))
    return list(cells)


def compute_cell(conf: Any, cell_uuid: str | None) -> str:
    """A compute's ``[data_plane] cell``: as the stream's file sets it, else its
    ``[shared_host_manager] cell_uuid`` (OperatorError without either)."""
    if conf.data_plane.cell:
        return str(conf.data_plane.cell)
    if not cell_uuid:
        raise OperatorError("[shared_host_manager] cell_streams needs the compute's cell: set "
                            "[shared_host_manager] cell_uuid (nova-manage cell_v2 list_cells)")
    conf.set_override("cell", cell_uuid, group="data_plane")
    return cell_uuid
