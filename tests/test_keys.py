"""``shm keys``: key file lines that a key file reader accepts and that match the master's."""

from __future__ import annotations

import pytest
from oslo_config import cfg

from protocol.signing import Keyring
from shm_cli import keys
from transport import signing_opts

MASTER = "11" * 32


def test_derived_lines_verify_as_the_master_derives_them(tmp_path, capsys, monkeypatch):
    master = tmp_path / "master.key"
    master.write_text(MASTER + "\n")
    assert keys.main(["--master-key-file", str(master), "ctl1-api-0", "ctl1-conductor-0"]) == 0
    key_file = tmp_path / "keys"
    key_file.write_text(capsys.readouterr().out)
    conf = cfg.ConfigOpts()
    signing_opts.register_opts(conf)
    conf([], default_config_files=[], default_config_dirs=[])
    conf.set_override("enabled", True, group="signing")
    conf.set_override("key_file", str(key_file), group="signing")
    from_file = signing_opts.keyring_from_conf(conf)
    from_master = Keyring({}, bytes.fromhex(MASTER), required=True)
    assert from_file is not None
    for name in ("ctl1-api-0", "ctl1-conductor-0"):
        assert from_file.key_for(name) == from_master.key_for(name)
    assert from_file.key_for("ctl1-api-1") is None  # only what was asked for


def test_no_master_secret_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("SHM_MASTER_KEY", raising=False)
    with pytest.raises(SystemExit) as exc:
        keys.main(["x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("no master secret: give --master-key-file FILE or set SHM_MASTER_KEY")
