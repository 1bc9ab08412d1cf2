"""nova-scheduler-shared: patches nova, starts the cache in pre_start_hook, stops it on shutdown.

Runs in a fresh interpreter: nova's starters switch the process to the threading
backend and poison eventlet, which must not leak into the rest of the suite.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

pytestmark = pytest.mark.nova

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _configs(tmp_path, section: str, name: str, default: str = "", shared: str = ""):
    """The stream configuration (``[section] name``, in-process planes) and a nova.conf pointing
    at it, with ``default`` lines in [DEFAULT] and ``shared`` in [shared_host_manager]."""
    shm_conf = tmp_path / "shared-host-manager.conf"
    shm_conf.write_text(f"[{section}]\nname = {name}\n[data_plane]\nbackend = inprocess\n"
                        "[control_plane]\nbackend = inprocess\n")
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text(f"[DEFAULT]\ntransport_url = fake:/\n{default}"
                         f"[shared_host_manager]\nconfig_files = {shm_conf}\n{shared}")
    return shm_conf, nova_conf


@pytest.mark.slow
def test_scheduler_entry_point_runs_nova_with_the_shared_host_manager(tmp_path):
    shm_conf, nova_conf = _configs(
        tmp_path, "cache", "sched-test", "[scheduler]\nworkers = 1\n",
        "default_cell_uuid = 98122654-4bb9-5c69-a805-dc5296ceea5c\n")
    code = textwrap.dedent(f"""
        import sys, warnings
        warnings.simplefilter("ignore")
        sys.argv = ["nova-scheduler-shared", "--config-file", {str(nova_conf)!r}]
        import nova.cmd.scheduler as nova_scheduler
        from shared_host_manager.nova import cmd, host_manager as shm
        from shared_host_manager.nova.testing import fixtures as fx

        def fake_nova_main():
            # what nova's main() does up to service.serve(), then the worker's start and stop
            from nova import config, objects, rpc
            from nova.scheduler import host_manager as nova_hm, manager as nova_manager
            from nova.scheduler.client import report
            config.parse_args(sys.argv)
            objects.register_all()
            assert nova_hm.HostManager is shm.SharedHostManager
            report.report_client_singleton = lambda: fx.FakePlacement([])
            mgr = nova_manager.SchedulerManager()        # built before the fork: no cache yet
            assert mgr.host_manager._cache is None
            mgr.pre_start_hook(None)                     # in the worker: the cache starts
            service = cmd.scheduler_service()
            assert service.running and service.name == "sched-test"
            assert mgr.host_manager.cache is service.cache
            assert list(mgr.host_manager.get_host_states_by_uuids(None, None, None)) == []
            assert mgr.host_manager.default_cell_uuid.startswith("98122654")
            mgr.graceful_shutdown(0)
            assert not service.running
            print("ok")

        nova_scheduler.main = fake_nova_main
        cmd.main()
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.slow
def test_compute_entry_point_hooks_the_tracker_and_starts_a_reporter(tmp_path):
    shm_conf, nova_conf = _configs(
        tmp_path, "reporter", "compute-test", "reserved_host_memory_mb = 512\n",
        "cell_uuid = 98122654-4bb9-5c69-a805-dc5296ceea5c\naggregate_refresh_interval = 0\n")
    code = textwrap.dedent(f"""
        import sys, warnings
        warnings.simplefilter("ignore")
        sys.argv = ["nova-compute-shared", "--config-file", {str(nova_conf)!r}]
        import nova.cmd.compute as nova_compute
        from shared_host_manager.nova import cmd
        from shared_host_manager.nova.testing import fixtures as fx

        def fake_nova_main():
            from nova import config, objects
            from nova.compute import manager as compute_manager, resource_tracker
            config.parse_args(sys.argv)
            objects.register_all()
            assert hasattr(resource_tracker.ResourceTracker._update, "__wrapped__")
            assert hasattr(compute_manager.ComputeManager.set_host_enabled, "__wrapped__")
            cn = fx.compute_node(1)

            class RT:
                tracked_instances = {{fx.uuid_for("i", 1)}}
                def set_service_ref(self, ref):
                    self.service_ref = ref

            class Manager:  # what ComputeManager.pre_start_hook touches
                rt = RT()
                def update_available_resource(self, ctxt, startup=False):
                    # nova's would reach the wrapped ResourceTracker._update (which needs
                    # placement and a DB); feed the hook what that wrapper feeds it
                    cmd.install_compute().report(cn, instances=self.rt.tracked_instances)

            compute_manager.ComputeManager.pre_start_hook(Manager(), None)
            reporter = cmd.reporter_service()
            assert reporter.name == "compute-test"
            doc = reporter.manager.machines[cn.uuid].document
            assert doc["compute"]["cell_uuid"].startswith("98122654")
            assert doc["compute"]["reserved_memory_mb"] == 512
            assert list(doc["instances"]) == [fx.uuid_for("i", 1)]
            import threading
            mgr = Manager()
            mgr._shutdown_in_progress = threading.Event()
            # the first step of nova's Service.stop: the goodbye goes there, not in
            # graceful_shutdown (a thread nova may give up on before the process exits)
            compute_manager.ComputeManager.set_shutdown_in_progress(mgr)
            assert mgr._shutdown_in_progress.is_set()
            assert not reporter._running
            try:
                compute_manager.ComputeManager.graceful_shutdown(mgr, 0)
            except Exception:
                pass  # nova's own shutdown needs a real manager; ours ran in `finally`
            print("ok")

        nova_compute.main = fake_nova_main
        cmd.compute_main()
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_api_side_source_publishes_what_the_api_changes(tmp_path):
    """install_api(): nova's Service/Aggregate writes in this process reach the stream, from
    a source named by its slot (stable across restarts), started on its first use."""
    shm_conf, nova_conf = _configs(tmp_path, "reporter", "api-host",
                                   shared=f"api_lock_dir = {tmp_path}\n")
    code = textwrap.dedent(f"""
        import os, sys, warnings
        warnings.simplefilter("ignore")
        from nova import config, objects
        config.parse_args(["nova-api", "--config-file", {str(nova_conf)!r}])
        objects.register_all()
        from shared_host_manager.nova import cmd
        original = objects.Service.save
        objects.Service.save = lambda self: None  # no database here: nova's write "succeeds"
        publisher = cmd.install_api()
        assert cmd.install_api() is publisher and publisher.reporter is None  # not before use
        reporter = publisher.ensure_started()  # nothing to load: no database here
        assert reporter.name == "api-host-api-0" and publisher.started_in == os.getpid()
        service = objects.Service(host="host1", binary="nova-compute", disabled=False, forced_down=True)
        service.save()
        doc = reporter.manager.machines[reporter.name].document
        assert doc["services"]["host1"]["forced_down"] is True, doc
        assert doc["api"]["role"] == "nova-api"
        publisher.stop()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
