"""A stream per nova cell: which streams a process publishes to and reads.

Role: turn ``[data_plane] cell`` / ``cells`` and the sections
``[data_plane:<cell>]`` into stream names and broker URLs, the stream's and the
control plane's (docs/design.md §4.6).
A compute of cells v2 talks only to its own cell's message queue, so a reporter
in a cell publishes on ``<stream_name>.<cell>`` on its cell's broker; a
scheduler reads the deployment's stream ``stream_name`` (the API level: nova-api
and placement feeds, the schedulers' own entries; every host when there is one
cell) and each listed cell's stream, each at its own offset; it reaches a cell's
computes (resync requests) and hears them (answers, claim results) on the cell's
broker when ``[data_plane:<cell>] transport_url`` names one, else on the API level's.

Nothing here opens a connection: ``transport.factory`` builds the planes from
what this module resolves. A cell section is registered when the cell is
listed (oslo.config reads it from the files then), so its options exist only
for the cells named.
"""

from __future__ import annotations

import re

from oslo_config import cfg

from transport.opts import cell_group, register_cell_groups
from transport.startup import OperatorError

__all__ = ["DEFAULT_STREAM", "cell_control_urls", "cell_stream_name", "cell_urls", "cells",
           "publish_cell", "validate_cell"]

#: the label of the deployment's stream (``[data_plane] stream_name``) beside the cells'
DEFAULT_STREAM = "default"

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def validate_cell(name: str, option: str) -> str:
    """``name`` if it can name a cell, else the one-line OperatorError naming ``option``."""
    if not _NAME.match(name) or name == DEFAULT_STREAM:
        raise OperatorError(f"{option}: {name!r} is not a cell name (letters, digits, '_' and "
                            f"'-', at most 64, not {DEFAULT_STREAM!r})")
    return name


def cell_stream_name(stream_name: str, cell: str) -> str:
    """The stream of ``cell``: the deployment's stream name, a dot, the cell."""
    return f"{stream_name}.{cell}"


def publish_cell(conf: cfg.ConfigOpts) -> str | None:
    """The cell this process publishes in (``[data_plane] cell``), None: the deployment's
    stream."""
    cell = conf.data_plane.cell
    return validate_cell(cell, "[data_plane] cell") if cell else None


def cells(conf: cfg.ConfigOpts) -> list[str]:
    """The cells whose streams a scheduler reads (``[data_plane] cells``), in order,
    validated: each a cell name, none twice."""
    names = [validate_cell(c, "[data_plane] cells") for c in register_cell_groups(conf)]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise OperatorError(f"[data_plane] cells: {name!r} is listed twice")
        seen.add(name)
    return names


def cell_urls(conf: cfg.ConfigOpts) -> dict[str, str | None]:
    """Each read cell -> its broker URL (``[data_plane:<cell>] stream_url``, else
    ``[data_plane] stream_url``; None when neither is set)."""
    out: dict[str, str | None] = {}
    for cell in cells(conf):
        out[cell] = conf[cell_group(cell)].stream_url or conf.data_plane.stream_url
    return out


def cell_control_urls(conf: cfg.ConfigOpts) -> dict[str, str]:
    """Each read cell whose computes are reached on a broker of its own -> its
    oslo.messaging URL (``[data_plane:<cell>] transport_url``); the others are reached over
    ``[control_plane] transport_url``."""
    return {cell: url for cell in cells(conf)
            if (url := conf[cell_group(cell)].transport_url)}
