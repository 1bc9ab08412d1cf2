"""nova functional tests that use the drop-in's fixture where nova's developers put fixtures:
after nova's ``TestCase.setUp`` (its poison fixtures and configuration in place), before the
services start.  Run as a module by :mod:`.test_fixture_after_setup` (a process of its own:
nova's functional fixtures are once per process)."""

from __future__ import annotations

import os
import threading
import unittest

os.environ.setdefault("OS_NOVA_DISABLE_EVENTLET_PATCHING", "1")
# nova's functional package first: it sets nova up before any other nova module is imported
import nova.tests.functional  # noqa: E402,F401
from nova import test  # noqa: E402
from nova.tests import fixtures as nova_fixtures  # noqa: E402
from nova.tests.functional import fixtures as func_fixtures  # noqa: E402
from nova.tests.functional import integrated_helpers  # noqa: E402

from shared_host_manager.nova.fixtures import SharedHostManagerFixture  # noqa: E402


class FixtureAfterSetUp(test.TestCase, integrated_helpers.InstanceHelperMixin):

    def setUp(self) -> None:
        super().setUp()
        self.shm = self.useFixture(SharedHostManagerFixture())
        self.useFixture(nova_fixtures.NeutronFixture(self))
        self.glance = self.useFixture(nova_fixtures.GlanceFixture(self))
        self.placement = self.useFixture(func_fixtures.PlacementFixture()).api
        self.start_service("conductor")
        self.scheduler = self.start_service("scheduler")
        self.api = self.useFixture(nova_fixtures.OSAPIFixture(api_version="v2.1")).admin_api
        self.api.microversion = "latest"
        self._start_compute(host="host1")
        self._start_compute(host="host2")

    def test_boot_is_decided_by_the_drop_in(self) -> None:
        server = self._create_server(networks="none")
        self.assertIn(server["OS-EXT-SRV-ATTR:host"], ("host1", "host2"))
        figures = self.shm.figures()
        self.assertEqual(1, figures["decisions"])
        self.assertEqual(1, figures["schedulers"])
        self.assertGreaterEqual(figures["host_state_requests"], 1)

    def test_the_drop_in_options_are_settable(self) -> None:
        # [shared_host_manager] is registered in nova's CONF: a test can set the drop-in's options
        self.flags(vector_decisions=False, group="shared_host_manager")
        server = self._create_server(networks="none")
        self.assertIn(server["OS-EXT-SRV-ATTR:host"], ("host1", "host2"))

    def test_concurrent_first_uses_build_one_cache(self) -> None:
        from nova import context as nova_context

        manager = self.scheduler.manager
        barrier = threading.Barrier(8)
        ctxt = nova_context.get_admin_context()

        def sync() -> None:
            barrier.wait()
            manager.host_manager.sync_instance_info(ctxt, "host1", [])

        threads = [threading.Thread(target=sync) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(1, self.shm.figures()["schedulers"])

    def test_allocation_candidates_come_from_the_feed(self) -> None:
        # placement's database fixture started a feed: every request is answered from memory,
        # the view current before each decision (the second server sees the first's allocation)
        self.flags(placement_from_memory=True, group="shared_host_manager")
        first = self._create_server(networks="none")
        second = self._create_server(networks="none")
        figures = self.shm.figures()
        self.assertEqual(1, figures["placement_feeds"])
        self.assertEqual(2, figures["candidates_from_memory"], figures)
        self.assertEqual(0, figures["candidates_from_placement"], figures)
        # the view holds what placement holds: both servers' allocations in the usages
        view = self.shm.schedulers[0].placement_view
        used = {}
        for server in (first, second):
            for rp, alloc in self.placement.get(
                    f"/allocations/{server['id']}").body["allocations"].items():
                used[rp] = used.get(rp, 0) + alloc["resources"]["MEMORY_MB"]
        self.shm.sync()
        for rp, mb in used.items():
            self.assertEqual(mb, view.provider(rp)["usages"]["MEMORY_MB"])

    def test_figures_count_this_fixtures_managers_only(self) -> None:
        from shared_host_manager.nova import host_manager
        from shared_host_manager.nova.testing import fixtures as fx

        self._create_server(networks="none")
        served = self.shm.figures()["host_state_requests"]
        self.assertGreaterEqual(served, 1)
        # a manager built later, not on this fixture's caches, changes nothing of its figures
        other = host_manager.SharedHostManager(fx.cache_from_documents({}))
        for _ in range(served + 4):
            list(other.get_host_states_by_uuids(None, None, None))
        self.assertEqual(served, self.shm.figures()["host_state_requests"])


class FixtureWithoutPlacementDatabase(test.TestCase, integrated_helpers.InstanceHelperMixin):
    """placement's app over a database set up before the drop-in's fixture: no feed, and every
    request is answered by placement (reason no_feed)."""

    def setUp(self) -> None:
        super().setUp()
        self.useFixture(nova_fixtures.NeutronFixture(self))
        self.glance = self.useFixture(nova_fixtures.GlanceFixture(self))
        self.useFixture(func_fixtures.PlacementFixture())
        self.shm = self.useFixture(SharedHostManagerFixture())
        self.start_service("conductor")
        self.start_service("scheduler")
        self.api = self.useFixture(nova_fixtures.OSAPIFixture(api_version="v2.1")).admin_api
        self.api.microversion = "latest"
        self._start_compute(host="host1")

    def test_placement_answers_without_a_feed(self) -> None:
        server = self._create_server(networks="none")
        self.assertEqual("host1", server["OS-EXT-SRV-ATTR:host"])
        figures = self.shm.figures()
        self.assertEqual(0, figures["placement_feeds"])
        self.assertEqual(0, figures["candidates_from_memory"])
        self.assertEqual({"no_feed": 1}, figures["candidates_by_reason"])


if __name__ == "__main__":
    unittest.main()
