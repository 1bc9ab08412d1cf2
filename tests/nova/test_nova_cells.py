"""``[shared_host_manager] cell_streams``: a stream per cell from nova's cell mappings."""

from __future__ import annotations

import pytest
from oslo_config import cfg

pytest.importorskip("nova")

from shared_host_manager.nova import cells  # noqa: E402
from shared_host_manager.nova.testing import fixtures as fx  # noqa: E402
from transport import cells as transport_cells  # noqa: E402
from transport import factory  # noqa: E402
from transport import opts as transport_opts  # noqa: E402
from transport.startup import OperatorError  # noqa: E402

CELL1 = "11111111-1111-4111-8111-111111111111"
CELL2 = "22222222-2222-4222-8222-222222222222"
CELL3 = "33333333-3333-4333-8333-333333333333"


def _conf(text: str, tmp_path) -> cfg.ConfigOpts:
    path = tmp_path / "shm.conf"
    path.write_text(text)
    conf = cfg.ConfigOpts()
    transport_opts.register_opts(conf)
    conf(["--config-file", str(path)], default_config_files=[], default_config_dirs=[])
    return conf


@pytest.mark.parametrize("url, kombu", [
    ("rabbit://u:p@cell1-mq:5672/", "amqp://u:p@cell1-mq:5672/"),
    ("rabbit://u:p@h1:5672,u:p@h2:5672/nova?ssl=1", "amqp://u:p@h1:5672/nova;amqp://u:p@h2:5672/nova"),
    ("rabbit://u:p@h1", "amqp://u:p@h1/"),
])
def test_a_cells_transport_url_is_its_brokers_kombu_url(url: str, kombu: str) -> None:
    assert cells.kombu_url(url) == kombu


def test_a_cell_without_a_rabbit_queue_cannot_carry_a_stream() -> None:
    with pytest.raises(OperatorError, match="only rabbit://"):
        cells.kombu_url("fake:/")


@pytest.fixture(scope="module")
def mappings(tmp_path_factory):
    """Three cells in a real nova API database, read back as the scheduler does, and cell0
    (in memory only: nova's database fixtures are process-wide, and the scheduler tests
    after this module make their own cell0), removed again at the end."""
    fx.setup_nova()
    db = fx.NovaDatabase(str(tmp_path_factory.mktemp("novadb-cells")))
    db.configure()
    from nova import context, objects

    ctxt = context.get_admin_context()
    made = []
    for uuid, name, url in ((CELL1, "cell1", "rabbit://u:p@cell1-mq:5672/"),
                            (CELL2, "cell2", "rabbit://u:p@cell2-mq:5672/c2"),
                            (CELL3, "cell3", "rabbit://u:p@cell3-mq:5672/")):
        mapping = objects.CellMapping(ctxt, uuid=uuid, name=name, transport_url=url,
                                      database_connection=db.cell_url)
        mapping.create()
        made.append(mapping)
    cell0 = objects.CellMapping(uuid=objects.CellMapping.CELL0_UUID, transport_url="none:/")
    try:
        yield [cell0, *(m for m in objects.CellMappingList.get_all(ctxt)
                        if m.uuid in (CELL1, CELL2, CELL3))]
    finally:
        for mapping in made:
            mapping.destroy()


def test_a_scheduler_reads_every_mapped_cells_stream_on_its_broker(mappings, tmp_path) -> None:
    conf = _conf(f"[data_plane]\nbackend = rabbit\nstream_url = amqp://api-mq//\n"
                 f"stream_name = hs\n[data_plane:{CELL3}]\nstream_url = amqp://other//\n", tmp_path)
    assert cells.apply_cell_mappings(conf, mappings) == [CELL1, CELL2, CELL3]
    planes = factory.build_cell_planes(conf)
    assert {c: (p.settings.url, p.settings.name) for c, p in planes.items()} == {  # type: ignore[attr-defined]
        CELL1: ("amqp://u:p@cell1-mq:5672/", f"hs.{CELL1}"),
        CELL2: ("amqp://u:p@cell2-mq:5672/c2", f"hs.{CELL2}"),
        CELL3: ("amqp://other//", f"hs.{CELL3}"),  # the stream's file wins
    }
    # and each cell's computes are reached on the cell's own message queue
    assert transport_cells.cell_control_urls(conf) == {
        CELL1: "rabbit://u:p@cell1-mq:5672/", CELL2: "rabbit://u:p@cell2-mq:5672/c2",
        CELL3: "rabbit://u:p@cell3-mq:5672/"}


def test_cells_listed_in_the_streams_file_win_over_the_mappings(mappings, tmp_path) -> None:
    conf = _conf("[data_plane]\ncells = cell1\n", tmp_path)
    assert cells.apply_cell_mappings(conf, mappings) == ["cell1"]
    assert conf.data_plane.cells == ["cell1"]


def test_a_compute_publishes_on_the_stream_of_its_cell_uuid(tmp_path) -> None:
    conf = _conf("[data_plane]\nbackend = rabbit\nstream_url = amqp://cell2-mq//\n"
                 "stream_name = hs\n", tmp_path)
    assert cells.compute_cell(conf, CELL2) == CELL2
    plane = factory.build_data_plane(conf, cell=conf.data_plane.cell)
    assert (plane.settings.url, plane.settings.name) == ("amqp://cell2-mq//", f"hs.{CELL2}")  # type: ignore[attr-defined]
    named = _conf("[data_plane]\ncell = east\n", tmp_path)
    assert cells.compute_cell(named, CELL2) == "east"
    with pytest.raises(OperatorError, match="cell_uuid"):
        cells.compute_cell(_conf("", tmp_path), None)


def test_nova_scheduler_shared_reads_the_mappings_when_its_service_is_built(mappings,
                                                                           tmp_path) -> None:
    from shared_host_manager.nova import cmd

    conf = _conf("[data_plane]\nstream_name = hs\n", tmp_path)
    cmd._read_cells(conf)  # what scheduler_service() does with cell_streams
    # every mapping of the (process-wide) API database, ours among them
    assert {CELL1, CELL2, CELL3} <= set(conf.data_plane.cells)
    assert cells.CELL0_UUID not in conf.data_plane.cells
