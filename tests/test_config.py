"""The sample configuration is generated from the oslo.config entry points."""

import configparser
import os
import re
import shutil
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_oslo_config_generator_writes_every_group(tmp_path):
    exe = shutil.which("oslo-config-generator", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("oslo-config-generator is not installed (pip install -e . installs it)")
    out = tmp_path / "shm.conf.sample"
    subprocess.run([exe, "--config-file", os.path.join(TOP, "etc/shm-config-generator.conf"),
                    "--output-file", str(out)], check=True, cwd=TOP, timeout=120)
    text = out.read_text()
    for group in ("[DEFAULT]", "[cache]", "[signing]", "[data_plane]", "[control_plane]",
                  "[reporter]", "[scheduler]", "[filter_scheduler]"):
        assert group in text, group
    # every option carries its help text into the operator's manual
    assert "#concurrency_backend = threading" in text
    assert "Seconds without any message from a source" in text


def _generate(tmp_path, generator: str = "etc/shm-config-generator.conf") -> str:
    """What oslo-config-generator writes today from the ``generator`` configuration file."""
    exe = shutil.which("oslo-config-generator", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("oslo-config-generator is not installed (pip install -e . installs it)")
    out = tmp_path / "generated.conf.sample"
    subprocess.run([exe, "--config-file", os.path.join(TOP, generator),
                    "--output-file", str(out)], check=True, cwd=TOP, timeout=120,
                   capture_output=True)
    return out.read_text()


def test_the_committed_sample_config_is_current(tmp_path):
    """etc/shm.conf.sample is what the generator writes today, with the oslo.messaging groups
    that option help refers to ([oslo_messaging_rabbit]) and [metrics]."""
    fresh = _generate(tmp_path)
    committed = open(os.path.join(TOP, "etc/shm.conf.sample"), encoding="utf-8").read()
    assert committed == fresh, ("etc/shm.conf.sample is stale: run .venv/bin/oslo-config-generator "
                                "--config-file etc/shm-config-generator.conf")
    for group in ("[metrics]", "[oslo_messaging_rabbit]", "[update_log]"):
        assert group in committed, group


def test_the_committed_nova_sample_config_is_current(tmp_path):
    """etc/nova-shared.conf.sample: the [shared_host_manager] options of nova.conf."""
    fresh = _generate(tmp_path, "etc/nova-shared-config-generator.conf")
    committed = open(os.path.join(TOP, "etc/nova-shared.conf.sample"), encoding="utf-8").read()
    assert committed == fresh, (
        "etc/nova-shared.conf.sample is stale: run .venv/bin/oslo-config-generator "
        "--config-file etc/nova-shared-config-generator.conf")
    assert "[shared_host_manager]" in committed and "#api_publish_timeout = 2.0" in committed


def _all_options():
    from oslo_config import cfg

    from shm_cli import common, reporter, scheduler

    conf = cfg.ConfigOpts()
    conf.register_opts(common.common_opts)
    reporter.register(conf)
    scheduler.register(conf)
    return conf


def _ini_blocks(path):
    text = open(os.path.join(TOP, path), encoding="utf-8").read()
    return re.findall(r"```ini\n(.*?)```", text, re.S)


@pytest.mark.parametrize("doc", ["docs/operating.md", "docs/update-log.md"])
def test_every_ini_block_of_the_docs_loads_as_copied(doc, tmp_path):
    """Copy each ```ini block into a file and start from it: every section and option exists,
    every value converts, and no value carries an inline comment."""
    from transport.startup import check_conf_values

    blocks = _ini_blocks(doc)
    assert blocks, f"{doc} has no ini block"
    for i, block in enumerate(blocks):
        path = tmp_path / f"block{i}.conf"
        path.write_text(block)
        conf = _all_options()
        conf(["--config-file", str(path)], project="shm", default_config_files=[],
             default_config_dirs=[])
        check_conf_values(conf)
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(block)
        for section in parser.sections():
            group = conf[section]
            for key in parser[section]:
                assert key in group, f"{doc} block {i}: [{section}] {key} is not an option"
                getattr(group, key)


def test_an_inline_comment_is_refused_with_the_option_named(tmp_path):
    from transport.startup import OperatorError, check_conf_values

    path = tmp_path / "bad.conf"
    path.write_text("[reporter]\nname = compute-01  # its control-plane address\n")
    conf = _all_options()
    conf(["--config-file", str(path)], project="shm", default_config_files=[], default_config_dirs=[])
    with pytest.raises(OperatorError, match=r"\[reporter\] name = 'compute-01  # its"):
        check_conf_values(conf)


UNITS = {
    "shm-reporter.service": "shm reporter",
    "shm-scheduler.service": "shm scheduler",
    "shm-placement-feed.service": "shm placement-feed",
    "nova-compute-shared.service": "nova-compute-shared",
    "nova-scheduler-shared.service": "nova-scheduler-shared",
    "nova-conductor-shared.service": "nova-conductor-shared",
}


@pytest.mark.parametrize("unit,command", sorted(UNITS.items()))
def test_systemd_units_run_the_documented_commands(unit, command):
    path = os.path.join(TOP, "etc/systemd", unit)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(path)
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    service = parser["Service"]
    assert command in service["ExecStart"] and "--config-file" in service["ExecStart"]
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "78"  # a mistake: restarting repeats it
    script = command.split()[0]
    setup_py = open(os.path.join(TOP, "setup.py"), encoding="utf-8").read()
    assert f'"{script} = ' in setup_py, f"{script} is not a console script"
    if command.startswith("shm "):
        assert f"shm {command.split()[1]}" in open(os.path.join(TOP, "README.md")).read()
