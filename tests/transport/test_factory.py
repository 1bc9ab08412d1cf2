"""Options, the config-driven factory, backoff and the eventlet guard."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest
from oslo_config import cfg

from transport import base, factory, opts
from transport.backoff import Backoff
from transport.inprocess import InProcessBus
from transport.startup import OperatorError


@pytest.fixture
def conf():
    c = cfg.ConfigOpts()
    opts.register_opts(c)
    c([])
    return c


def test_list_opts_shape_and_help():
    groups = dict((g.name, o) for g, o in opts.list_opts())
    assert set(groups) == {"data_plane", "data_plane:<cell>", "control_plane", "signing"}
    names = {o.name for o in groups["data_plane"]}
    assert {"backend", "stream_url", "stream_name", "stream_max_age",
            "stream_max_length_bytes", "prefetch_count",
            "publisher_confirms"} <= names
    assert {"backend", "transport_url", "reporter_topic",
            "scheduler_topic"} <= {o.name for o in groups["control_plane"]}
    for group_opts in groups.values():
        for opt in group_opts:
            assert "Possible values" in opt.help and "Related options" in opt.help


def test_register_opts_is_idempotent(conf):
    opts.register_opts(conf)
    assert conf.data_plane.backend == "inprocess"


def test_bad_max_age_is_a_config_error(conf):
    with pytest.raises(ValueError):
        conf.set_override("stream_max_age", "one hour", "data_plane")


def test_default_is_one_shared_inprocess_bus(conf):
    t = factory.build_transports(conf)
    assert isinstance(t.bus, InProcessBus) and t.owns_bus
    assert t.data is t.bus and t.control is t.bus
    assert t.bus.threaded
    got = []
    srv = t.control.control_server(conf.control_plane.reporter_topic, "n1", got.append)
    srv.start()
    t.control.control_client().cast(conf.control_plane.reporter_topic, "n1", b"x")
    t.close()
    assert got in ([b"x"], [])  # threaded: may or may not have run yet


def test_given_bus_is_reused_and_not_closed(conf):
    conf.set_override("inprocess_mode", "sync", "data_plane")
    bus = factory.build_inprocess_bus(conf)
    assert not bus.threaded
    t = factory.build_transports(conf, bus=bus)
    assert t.bus is bus and not t.owns_bus
    t.close()
    bus.stream_consumer().start(lambda b, o: None)  # still open


def test_inprocess_retention_from_config(conf):
    conf.set_override("inprocess_mode", "sync", "data_plane")
    conf.set_override("inprocess_max_messages", 3, "data_plane")
    bus = factory.build_inprocess_bus(conf)
    pub = bus.stream_publisher()
    for _ in range(5):
        pub.publish(b"x")
    assert bus.stream_bounds() == (2, 5)


def test_rabbit_backend_needs_stream_url(conf):
    conf.set_override("backend", "rabbit", "data_plane")
    with pytest.raises(OperatorError, match=r"\[data_plane\] stream_url is required"):
        factory.build_data_plane(conf)


def test_oslo_backend_needs_a_transport_url(conf):
    """oslo.messaging would fall back to rabbit://guest:guest@localhost: an error instead."""
    conf.set_override("backend", "oslo", "control_plane")
    with pytest.raises(OperatorError, match=r"\[control_plane\] transport_url is required"):
        factory.build_control_plane(conf)


def test_stream_settings_from_config(conf):
    from transport.kombu_stream import KombuStreamDataPlane

    conf.set_override("backend", "rabbit", "data_plane")
    conf.set_override("stream_url", "amqp://u:p@h:5672//", "data_plane")
    conf.set_override("stream_max_age", "", "data_plane")
    conf.set_override("stream_max_length_bytes", 0, "data_plane")
    conf.set_override("stream_max_segment_size_bytes", 1000, "data_plane")
    conf.set_override("publisher_confirms", False, "data_plane")
    plane = factory.build_data_plane(conf)
    assert isinstance(plane, KombuStreamDataPlane)
    assert isinstance(plane, base.DataPlane)
    s = plane.settings
    assert (s.url, s.name, s.publisher_confirms) == ("amqp://u:p@h:5672//", "shm-hoststate", False)
    assert s.queue_arguments() == {"x-queue-type": "stream",
                                   "x-stream-max-segment-size-bytes": 1000}


def test_oslo_control_plane_from_config(conf):
    conf.set_override("backend", "oslo", "control_plane")
    conf.set_override("transport_url", "fake://", "control_plane")
    conf.set_override("cast_retry", -1, "control_plane")
    t = factory.build_transports(conf)
    try:
        assert isinstance(t.control, base.ControlPlane)
        assert t.control.cast_retry is None and t.control.pool_size == 1
        assert isinstance(t.bus, InProcessBus)  # the data plane still is
    finally:
        t.close()


def test_backoff_grows_caps_and_jitters():
    b = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.2, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    nominal = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    for d, n in zip(delays, nominal, strict=True):
        assert 0.8 * n <= d <= 1.2 * n
    b.reset()
    assert b.next_delay() <= 0.12
    with pytest.raises(ValueError):
        Backoff(initial=0)


def test_importing_planes_never_loads_eventlet():
    code = textwrap.dedent("""
        import sys
        import transport.factory, transport.inprocess, transport.kombu_stream
        assert "oslo_messaging" not in sys.modules
        import transport.oslo_rpc
        import oslo_messaging
        from oslo_config import cfg
        plane = transport.oslo_rpc.OsloRpcControlPlane(cfg.ConfigOpts(), "fake://")
        srv = plane.control_server("t", "s", lambda b: None)
        srv.start(); srv.stop(); plane.close()
        loaded = [m for m, v in sys.modules.items() if m.startswith("eventlet") and v is not None]
        assert not loaded, loaded
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_overrides_do_not_leak_between_confs():
    a, b = cfg.ConfigOpts(), cfg.ConfigOpts()
    opts.register_opts(a)
    opts.register_opts(b)
    a([])
    b([])
    a.set_override("backend", "rabbit", "data_plane")
    assert b.data_plane.backend == "inprocess"


def test_topics(conf):
    assert factory.topics(conf) == factory.Topics(reporter="shm-reporter", scheduler="shm-scheduler")
    conf.set_override("reporter_topic", "r", "control_plane")
    assert factory.topics(conf).reporter == "r"


def test_from_conf_shares_the_process_bus_between_parties(conf):
    factory.close_default_bus()
    try:
        data1, control1 = factory.from_conf(conf)
        other = cfg.ConfigOpts()
        opts.register_opts(other)
        other([])
        data2, control2 = factory.from_conf(other)
        assert data1 is data2 is control1 is control2 is factory.default_bus(conf)
        bus = InProcessBus(threaded=False)
        assert factory.from_conf(conf, bus=bus) == (bus, bus)
    finally:
        factory.close_default_bus()
    assert data1.closed
    assert factory.default_bus(conf) is not data1
    factory.close_default_bus()
