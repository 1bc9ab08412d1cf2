"""``shm reporter --config-file FILE``: run a compute reporter until SIGTERM."""

from __future__ import annotations

from oslo_config import cfg

from shared_host_manager.cmd import common


def _register(conf: cfg.ConfigOpts) -> None:
    from compute_reporter import conf as reporter_conf
    from shared_host_manager.conf import signing, updatelog
    from transport import opts as transport_opts

    updatelog.register_opts(conf)
    reporter_conf.register_opts(conf)
    signing.register_opts(conf)
    transport_opts.register_opts(conf)


def build(conf: cfg.ConfigOpts):
    from compute_reporter.service import ReporterService
    from compute_reporter.tracker import SimulatedTracker
    from protocol.codec import Decoder, Encoder
    from shared_host_manager.conf.signing import keyring_from_conf
    from shared_host_manager.updatelog import from_conf as recorder_from_conf
    from transport import factory

    group = conf.reporter
    keyring = keyring_from_conf(conf)
    tracker = SimulatedTracker(group.simulated_hosts, seed=group.simulated_seed,
                               prefix=group.name,
                               change_interval=group.simulated_change_interval)
    data_plane, control_plane = factory.from_conf(conf)
    topics = factory.topics(conf)
    return ReporterService(
        group.name, tracker, data_plane, control_plane,
        reporter_topic=topics.reporter, scheduler_topic=topics.scheduler,
        encoder=Encoder(keyring), decoder=Decoder(keyring), state_dir=group.state_dir,
        coalesce_window=group.coalesce_window, heartbeat_interval=group.heartbeat_interval,
        ring_size=group.ring_size, max_batch_items=group.max_batch_items,
        recorder=recorder_from_conf(conf))


def main(argv: list[str]) -> int:
    conf = common.setup(argv, "shm reporter", _register)
    service = build(conf)
    return common.run_until_signalled(service.start, service.stop)
