"""``shm reporter``'s update log: built from ``[update_log]`` by the reporter's own recorder
(compute_reporter/recorder.py, no scheduler package in the process), in the format ``shm
replay`` reads."""

from __future__ import annotations

import subprocess
import sys

import pytest
from oslo_config import cfg
from svc_harness import make_reporter, wait_for

from compute_reporter.recorder import ReporterRecorder
from shm_cli import reporter as reporter_cli
from transport.inprocess import InProcessBus
from transport.startup import OperatorError
from transport.updatelog.format import PUBLISHED, REPORTER
from transport.updatelog.reader import LogReader, resolve_log


def _conf(**update_log) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    reporter_cli.register(conf)
    conf([], project="shm")
    for name, value in update_log.items():
        conf.set_override(name, value, group="update_log")
    return conf


def test_the_reporter_process_loads_nothing_of_the_scheduler_package():
    code = ("import sys, shm_cli.reporter, compute_reporter.recorder\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'shared_host_manager')\n"
            "assert not loaded, loaded\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_update_log_options_build_the_reporters_recorder(tmp_path):
    assert reporter_cli.recorder_from_conf(_conf()) is None
    with pytest.raises(OperatorError, match="directory"):
        reporter_cli.recorder_from_conf(_conf(enabled=True))
    rec = reporter_cli.recorder_from_conf(_conf(enabled=True, directory=str(tmp_path),
                                                max_file_bytes=1 << 20))
    assert type(rec) is ReporterRecorder
    assert rec.directory == str(tmp_path) and rec.max_file_bytes == 1 << 20
    assert rec.max_total_bytes == 2 * 1024 ** 3 and rec.max_age == 7 * 24 * 3600


def test_a_reporter_recorded_by_its_own_recorder_replays(tmp_path):
    from shared_host_manager.updatelog.replay import replay  # the scheduler side reads it

    rec = reporter_cli.recorder_from_conf(_conf(enabled=True, directory=str(tmp_path)))
    assert rec is not None
    bus = InProcessBus(threaded=True)
    try:
        reporter = make_reporter(bus, bus, "r0", hosts=4, seed=1, change_interval=0.05, recorder=rec)
        reporter.start()
        try:
            wait_for(lambda: reporter.stats["published"] >= 3, what="three publishes")
        finally:
            reporter.stop()  # closes the recorder
    finally:
        bus.close()
    assert rec.closed and rec.errors == 0 and rec.path is not None
    parts = resolve_log(rec.path)
    reader = LogReader(parts)
    kinds = [r.kind for r in reader if r.index >= 0]
    assert reader.damage is None and kinds.count(PUBLISHED) >= 3
    header = reader.headers[0]
    assert header["role"] == REPORTER and header["name"] == "r0"
    assert set(header["config"]["sources"]) == set(reporter.manager.machines)
    result = replay(parts)
    assert result.ok and result.records == len(kinds) and result.divergences == 0
