"""The sample configuration is generated from the oslo.config entry points."""

import os
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
