"""``shm keys NAME [NAME ...]``: the signing key file lines of the named speakers.

With ``[signing] enabled``, every source signs with its own key, derived from the
master secret as HMAC-SHA256(master, name) (:mod:`transport.signing_opts`).  The
schedulers hold the master secret; every other process gets a key file with
only the keys it speaks with: a compute node its hosts' source names and the
schedulers it trusts, a nova-api or nova-conductor host its API-side sources.
API-side sources are named ``<[reporter] name>-api-<slot>`` (nova-api) and
``<[reporter] name>-conductor-<slot>`` (nova-conductor), slots 0 to workers - 1
(``[shared_host_manager] api_lock_dir``), so their keys can be made in advance::

    shm keys --master-key-file /etc/shm/master.key \\
        ctl1-api-0 ctl1-api-1 ctl1-conductor-0 sched-1 sched-2 > /etc/nova/shm-keys

prints ``name = hex key`` per name, the format ``[signing] key_file`` reads.
The master secret is read from a file (hex, as ``[signing] master_key``) or from
the environment variable ``SHM_MASTER_KEY``, never from the command line, where
other users could read it.
"""

from __future__ import annotations

import argparse
import os
import sys

from protocol.signing import derive_key


def build_parser(prog: str = "shm keys") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="+", metavar="NAME",
                   help="a source or scheduler name (a compute's source is its compute "
                        "node's uuid; see the module help for API-side names)")
    p.add_argument("--master-key-file", metavar="FILE",
                   help="file holding the hex master secret (default: $SHM_MASTER_KEY)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.master_key_file:
        try:
            with open(args.master_key_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            parser.error(f"--master-key-file: cannot read {args.master_key_file} ({exc.strerror})")
    else:
        text = os.environ.get("SHM_MASTER_KEY", "")
        if not text:
            parser.error("no master secret: give --master-key-file FILE or set SHM_MASTER_KEY")
    try:
        master = bytes.fromhex(text.strip())
    except ValueError:
        parser.error("the master secret is not hex ([signing] master_key's format)")
    if not master:
        parser.error("the master secret is empty")
    for name in args.names:
        sys.stdout.write(f"{name} = {derive_key(master, name).hex()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
