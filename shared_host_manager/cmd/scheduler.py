"""``shm scheduler --config-file FILE``: run the scheduler-side cache until SIGTERM.

The cache is what a scheduler process embeds; run standalone it keeps an
up-to-date view of every host and logs its state, which is how an operator
checks a deployment's stream before pointing a scheduler at it.
"""

from __future__ import annotations

import threading

from oslo_config import cfg
from oslo_log import log as logging

from shared_host_manager.cmd import common

LOG = logging.getLogger(__name__)


def _register(conf: cfg.ConfigOpts) -> None:
    from shared_host_manager.conf import cache, signing, updatelog
    from transport import opts as transport_opts

    updatelog.register_opts(conf)
    cache.register_opts(conf)
    signing.register_opts(conf)
    transport_opts.register_opts(conf)


def build(conf: cfg.ConfigOpts):
    from protocol.codec import Decoder, Encoder
    from shared_host_manager.conf.signing import keyring_from_conf
    from shared_host_manager.service import SchedulerService
    from shared_host_manager.updatelog import from_conf as recorder_from_conf
    from transport import factory

    group = conf.cache
    keyring = keyring_from_conf(conf)
    data_plane, control_plane = factory.from_conf(conf)
    topics = factory.topics(conf)
    return SchedulerService(
        group.name, data_plane, control_plane,
        reporter_topic=topics.reporter, scheduler_topic=topics.scheduler,
        encoder=Encoder(keyring),
        decoder=Decoder(keyring, max_message_bytes=group.max_message_bytes),
        state_dir=group.state_dir, snapshot_interval=group.snapshot_interval,
        tick_interval=group.tick_interval, reorder_window=group.reorder_window,
        reorder_timeout=group.reorder_timeout, resync_timeout=group.resync_timeout,
        resync_backoff_max=group.resync_backoff_max, down_interval=group.down_interval,
        claim_deadline=group.claim_deadline, recorder=recorder_from_conf(conf))


def main(argv: list[str]) -> int:
    conf = common.setup(argv, "shm scheduler", _register)
    service = build(conf)
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(10.0):
            with service.cache.lock:
                views = list(service.receiver.sources.values())
                active = sum(1 for v in views if v.status.value == "active")
            LOG.info("sources: %d held, %d active; stream offset %s; invalid %s",
                     len(views), active, service.cache.offset, dict(service.cache.invalid))

    reporter = threading.Thread(target=report, daemon=True)

    def start() -> None:
        service.start()
        reporter.start()

    def halt() -> None:
        stop.set()
        service.stop()

    return common.run_until_signalled(start, halt)
