"""Plugin loading (stevedore, with the built-in fallback) and the oslo.config options."""

from __future__ import annotations

from unittest import mock

import pytest
from oslo_config import cfg

from shared_host_manager.conf import decision as conf_decision
from shared_host_manager.conf.decision import SchedulerConfig
from shared_host_manager.decision import plugins
from shared_host_manager.decision.filters import BUILTIN_FILTERS, BaseHostFilter
from shared_host_manager.decision.filters.resource_fit_filter import ResourceFitFilter
from shared_host_manager.decision.weights import BUILTIN_WEIGHERS


def test_every_builtin_loads_from_a_source_tree():
    """The built-in tables hold only what nova has no class for: three filters, no weigher."""
    cfg_ = SchedulerConfig()
    filters = plugins.load_filters(BUILTIN_FILTERS, cfg_)
    assert [f.name for f in filters] == list(BUILTIN_FILTERS) == [
        "ResourceFitFilter", "AvailabilityZoneFilter", "VolumeLocalityFilter"]
    assert all(isinstance(f, BaseHostFilter) and f.config is cfg_ for f in filters)
    assert BUILTIN_WEIGHERS == {}


def test_unknown_name_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="NoSuchFilter.*ResourceFitFilter"):
        plugins.load_filters(["NoSuchFilter"], SchedulerConfig())


def test_an_entry_point_wins_over_the_builtin_table():
    class MyFit(ResourceFitFilter):
        pass

    ext = mock.Mock()
    ext.name = "ResourceFitFilter"
    ext.plugin = MyFit
    with mock.patch("stevedore.named.NamedExtensionManager", return_value=[ext]) as mgr:
        [flt] = plugins.load_filters(["ResourceFitFilter"], SchedulerConfig())
    assert type(flt) is MyFit
    assert mgr.call_args.args[0] == plugins.FILTER_NAMESPACE


def test_a_broken_entry_point_scan_falls_back_to_the_builtins():
    with mock.patch("stevedore.named.NamedExtensionManager", side_effect=RuntimeError("boom")):
        [flt] = plugins.load_filters(["ResourceFitFilter"], SchedulerConfig())
    assert type(flt) is ResourceFitFilter


def test_entry_point_lines_match_the_tables():
    lines = plugins.entry_point_lines()
    assert lines == {"shm.scheduler.filters": [
        f"{name} = {target}" for name, target in BUILTIN_FILTERS.items()]}


def test_the_decision_core_loads_one_engines_filters_and_weighers():
    """``decision_core``: the default, ``nova``, gives nova's class for every name nova has
    one for and the built-in class for the others; a core is loaded through the
    ``shm.scheduler.cores`` entry point group only; one that cannot load says what to do,
    in one line."""
    pytest.importorskip("nova.scheduler")
    config = SchedulerConfig(enabled_filters=("ComputeFilter", "ResourceFitFilter"),
                             weight_classes=("RAMWeigher",))
    assert config.decision_core == "nova"
    filters, weighers = plugins.load_core(config)
    assert [f.name for f in filters] == ["ComputeFilter", "ResourceFitFilter"]
    assert type(filters[0]).__name__ == "NovaFilter" and type(filters[1]) is ResourceFitFilter
    assert [w.name for w in weighers] == ["RAMWeigher"]
    with pytest.raises(ValueError, match="decision_core = ours cannot be loaded"):
        plugins.load_core(SchedulerConfig(decision_core="ours"))
    # as without nova: neither nova nor the core that imports it can be imported
    blocked = {"nova": None, "shared_host_manager.nova.core.plugins": None}
    with mock.patch.dict("sys.modules", blocked), \
            pytest.raises(ValueError, match=r"decision_core = nova cannot be loaded .*"
                                            r"pip install 'shared-host-manager\[sim\]'"):
        plugins.load_core(SchedulerConfig(decision_core="nova"))


def test_options_register_and_map_to_the_engine_config():
    conf = cfg.ConfigOpts()
    conf_decision.register_opts(conf)
    conf([], project="shm")
    assert SchedulerConfig.from_conf(conf) == SchedulerConfig()
    conf.set_override("enabled_filters", ["ComputeFilter", "IoOpsFilter"], group="filter_scheduler")
    conf.set_override("max_attempts", 5, group="scheduler")
    conf.set_override("ram_weight_multiplier", -1.0, group="filter_scheduler")
    got = SchedulerConfig.from_conf(conf)
    assert got.enabled_filters == ("ComputeFilter", "IoOpsFilter")
    assert got.max_attempts == 5 and got.ram_weight_multiplier == -1.0


def test_list_opts_covers_every_config_field_with_help():
    groups = dict(conf_decision.list_opts())
    assert set(groups) == {"scheduler", "filter_scheduler"}
    names = {o.name for opts in groups.values() for o in opts}
    assert names == set(SchedulerConfig.__dataclass_fields__)
    assert all(len(o.help) > 40 for opts in groups.values() for o in opts)
    defaults = {o.name: o.default for opts in groups.values() for o in opts}
    assert defaults["max_instances_per_host"] == 50 and defaults["max_io_ops_per_host"] == 8
    assert defaults["io_ops_weight_multiplier"] == -1.0 and defaults["max_attempts"] == 3


def test_a_real_entry_point_is_found_by_stevedore(tmp_path, monkeypatch):
    # an installed third-party package, as pip would lay it out: module + dist-info
    (tmp_path / "shm_test_plugin.py").write_text(
        "from shared_host_manager.decision.filters import BaseHostFilter\n"
        "class EvenHostFilter(BaseHostFilter):\n"
        "    def host_passes(self, host_state, spec_obj):\n"
        "        return host_state.host.endswith(('0', '2', '4', '6', '8'))\n")
    info = tmp_path / "shm_test_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shm-test-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[shm.scheduler.filters]\nEvenHostFilter = shm_test_plugin:EvenHostFilter\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # stevedore caches entry points per namespace for the life of the process (a plugin is
    # installed before the scheduler starts); this test installs one mid-process
    from stevedore import extension

    monkeypatch.setattr(extension.ExtensionManager, "ENTRY_POINT_CACHE", {})
    [flt] = plugins.load_filters(["EvenHostFilter"], SchedulerConfig())
    assert type(flt).__name__ == "EvenHostFilter" and flt.vector(None, None) is None
