"""The ``shm`` console script: one entry point, one subcommand per job.

Each subcommand lives in its own module and registers itself through
:data:`SUBCOMMANDS` (name -> "module:function" taking the remaining argv), so
``shm --help`` lists everything and importing the CLI imports no heavy module
(eventlet in particular is imported only by a backend that asks for it).
"""

from __future__ import annotations

import importlib
import sys
import warnings

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("shm_cli.sim:main",
            "simulate N compute nodes and compare shared / legacy / caching host managers"),
    "reporter": ("shm_cli.reporter:main",
                 "run a compute reporter (--config-file FILE) until SIGTERM"),
    "placement-feed": ("shm_cli.placement_feed:main",
                       "publish placement's resource providers on the stream (--config-file FILE)"),
    "scheduler": ("shm_cli.scheduler:main",
                  "run the scheduler-side host-state cache (--config-file FILE) until SIGTERM"),
    "status": ("shm_cli.status:main",
               "show running processes side by side (URL...); --verify that their views converged"),
    "replay": ("shm_cli.replay:main",
               "replay an update log: verify digests, show a host's state or history, "
               "diff two logs, re-run decisions"),
    "faults": ("shm_cli.faults:main",
               "run seeded fault schedules over the whole system and check the design's invariants"),
    "fuzz": ("shm_cli.fuzz:main",
             "fuzz the decoder, the receiver, the reporter's control door and the update-log reader"),
    "bench": ("shm_cli.bench:main",
              "run a benchmark (protocol, stream, decisions, updatelog, nova)"),
    "keys": ("shm_cli.keys:main",
             "print the signing key file lines of the named sources and schedulers"),
}


#: top-level modules that come with an extra, not with the base install
OPTIONAL = {"sqlalchemy": "sim", "matplotlib": "sim", "pymysql": "sim", "psycopg2": "sim",
            "nova": "nova"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: shm <command> [options]\n\ncommands:")
        for name, (_, text) in SUBCOMMANDS.items():
            print(f"  {name:<10} {text}")
        print("\n'shm <command> --help' describes a command.")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    # nova's imports reach libraries (futurist, oslo.service) that import eventlet when it
    # is installed (nova needs it), and eventlet warns that it is deprecated; nothing here
    # runs it unless asked ([DEFAULT] concurrency_backend = eventlet, which logs its own
    # warning), so eventlet's would only mislead
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    if name not in SUBCOMMANDS:
        print(f"shm: unknown command {name!r}; try 'shm --help'", file=sys.stderr)
        return 2
    module, func = SUBCOMMANDS[name][0].split(":")
    try:
        entry = getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as exc:
        extra = OPTIONAL.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"shm {name}: {exc.name} is not installed; "
              f"pip install 'shared-host-manager[{extra}]'", file=sys.stderr)
        return 2
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
