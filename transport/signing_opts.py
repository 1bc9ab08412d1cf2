"""Options for message signing (group ``[signing]``), shared by reporters and schedulers.

With signing on, every data item, claim result and resync answer is signed
with the key of the source it speaks for, and every claim and resync request
with the key of the scheduler that sent it; unsigned or badly signed messages
are dropped and counted.  Keys come from a key file (``name = hex secret``
lines) and/or are derived from a master secret (HMAC-SHA256(master, name)).
Give schedulers the master secret; give each compute node only its own
derived key and the scheduler keys, so that it cannot speak for another host.
"""

from __future__ import annotations

from oslo_config import cfg

from protocol.signing import Keyring

GROUP = "signing"
SIGNING_GROUP = cfg.OptGroup(GROUP, title="Message signing", help=__doc__.split("\n\n", 1)[1])

signing_opts = [
    cfg.BoolOpt("enabled", default=False,
                help="""
Sign every message sent and require a valid signature on every message received.

Possible values: true (a deployment: a compute node can then speak only for its
own hosts, a scheduler only for its own claims), false (trusted lab networks).

Related options: master_key, key_file.
"""),
    cfg.StrOpt("master_key", secret=True,
               help="""
Hex-encoded master secret; the key of any speaker is derived from it as
HMAC-SHA256(master, name).

Possible values: an even number of hex digits (32 bytes: 64 digits). Give it to
schedulers only (they verify every compute node).

Related options: key_file (what compute nodes get instead).
"""),
    cfg.StrOpt("key_file",
               help="""
File of explicit keys, one 'name = hex secret' per line ('#' starts a comment):
a compute node's own derived key and the keys of the schedulers it trusts.

Possible values: a path readable by the service.

Related options: master_key.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(signing_opts, group=GROUP)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(SIGNING_GROUP, signing_opts)]


def keyring_from_conf(conf: cfg.ConfigOpts) -> Keyring | None:
    """The keyring the codec should use, or None when signing is off."""
    group = conf[GROUP]
    if not group.enabled:
        return None
    keys: dict[str, bytes] = {}
    if group.key_file:
        with open(group.key_file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                name, sep, secret = line.partition("=")
                if not sep:
                    raise ValueError(f"{group.key_file}:{lineno}: expected 'name = hex secret'")
                keys[name.strip()] = bytes.fromhex(secret.strip())
    master = bytes.fromhex(group.master_key) if group.master_key else None
    if not keys and master is None:
        raise ValueError("[signing] enabled needs master_key or key_file")
    return Keyring(keys, master, required=True)
