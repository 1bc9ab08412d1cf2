"""Threads by default; eventlet only when asked (nova 34 makes ``import eventlet`` fail).

Each case runs in a fresh interpreter, since importing or poisoning eventlet is
process-wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, tmp_path=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=TOP,
                          capture_output=True, text=True, timeout=120)


def test_everything_runs_with_eventlet_poisoned_as_nova_does():
    # nova 34's threading mode makes every `import eventlet` fail; our services,
    # the in-process bus and the oslo.messaging control plane must all still work.
    result = _run("""
        import sys, time
        sys.modules["eventlet"] = None
        sys.path.insert(0, "tests")
        from oslo_config import cfg
        from svc_harness import converged, make_reporter, make_scheduler, quiesce, wait_for
        from transport.inprocess import InProcessBus
        from transport.oslo_rpc import OsloRpcControlPlane
        bus = InProcessBus()
        conf = cfg.ConfigOpts(); conf([])
        control = OsloRpcControlPlane(conf, "fake://")
        reporter = make_reporter(bus, control, "r", hosts=3, seed=1, change_interval=0)
        sched = make_scheduler(bus, control, "s")
        sched.start(); reporter.start()
        wait_for(lambda: len(sched.receiver.sources) == 3, 30, "sources")
        quiesce([reporter])
        wait_for(lambda: converged([reporter], [sched]), 30, "convergence")
        reporter.stop(); sched.stop(); control.close(); bus.close()
        assert sys.modules["eventlet"] is None
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_default_backend_never_imports_eventlet(tmp_path):
    result = _run("""
        import sys
        from oslo_config import cfg
        from shm_cli import common, scheduler
        conf = cfg.ConfigOpts()
        common.setup([], "test", scheduler.register, conf)
        service = scheduler.build(conf)
        service.start(); service.stop()
        assert conf.concurrency_backend == "threading"
        assert "eventlet" not in sys.modules, "eventlet was imported"
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-3000:]


def test_eventlet_backend_when_asked(tmp_path):
    config = tmp_path / "shm.conf"
    config.write_text("[DEFAULT]\nconcurrency_backend = eventlet\n")
    result = _run(f"""
        import sys
        from oslo_config import cfg
        from shm_cli import common, scheduler
        conf = cfg.ConfigOpts()
        common.setup(["--config-file", {str(config)!r}], "test", scheduler.register, conf)
        import eventlet.patcher
        assert eventlet.patcher.is_monkey_patched("socket")
        assert eventlet.patcher.is_monkey_patched("thread")
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
