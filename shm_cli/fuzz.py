"""``shm fuzz``: coverage-guided fuzzing of every door for untrusted bytes (design §6, invariant 6).

Runs :class:`simulator.fuzzing.FuzzTargets` (the decoder, a scheduler's cache and
receiver, a reporter's control door, the update-log reader, a scheduler's peer topic)
under atheris, the libFuzzer-based engine for Python (``pip install 'shared-host-manager[fuzz]'``),
starting from the corpus kept in ``tests/fuzz_corpus/``.  Any exception other than a
typed protocol error is a crash: atheris writes the input that caused it and exits 1.

``--write-corpus DIR`` writes the seed inputs (valid messages of every type, for every
door) instead of fuzzing.  The inputs a run found interesting stay in ``--work``; the small
ones are worth copying into ``tests/fuzz_corpus/`` (the suite replays them).

``--door NAME`` spends every input on one door: the engine's first byte is replaced by
that door's, so the corpus's inputs keep their layout; a crash input is also written with
the door's byte (``crash-<door>-<sha1>`` in ``--work``), ready for the corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import tempfile
import time

from simulator.fuzzing import TARGETS, FuzzTargets, seed_inputs

REPO_CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "tests", "fuzz_corpus")


def build_parser(prog: str = "shm fuzz") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 no crash, 1 a crash (its input is written), "
                                       "2 usage or atheris missing.")
    p.add_argument("--runs", type=int, default=1_000_000, metavar="N",
                   help="inputs to run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the engine's seed (default: 0, random)")
    p.add_argument("--corpus", metavar="DIR", default=REPO_CORPUS,
                   help="seed corpus, read only (default: tests/fuzz_corpus in the source tree)")
    p.add_argument("--work", metavar="DIR",
                   help="where new interesting inputs and crash inputs go (default: a temporary dir)")
    p.add_argument("--max-len", type=int, default=4096, help="longest input (default: %(default)s)")
    p.add_argument("--door", choices=TARGETS,
                   help="fuzz only this door (default: every door, picked by the first byte)")
    p.add_argument("--write-corpus", metavar="DIR", help="write the seed inputs to DIR and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.write_corpus:
        os.makedirs(args.write_corpus, exist_ok=True)
        for name, data in sorted(seed_inputs().items()):
            with open(os.path.join(args.write_corpus, name), "wb") as f:
                f.write(data)
        print(f"wrote {len(seed_inputs())} seed inputs to {args.write_corpus}")
        return 0
    if args.runs < 1:
        print("shm fuzz: --runs must be at least 1", file=sys.stderr)
        return 2
    try:
        import atheris  # noqa: PLC0415 — optional, only this command needs it
    except ImportError:
        print("shm fuzz: atheris is not installed; pip install 'shared-host-manager[fuzz]'",
              file=sys.stderr)
        return 2
    work = args.work or tempfile.mkdtemp(prefix="shm-fuzz-corpus-")
    os.makedirs(work, exist_ok=True)
    # every door logs each input it drops: millions of lines, and most of the time spent
    logging.disable(logging.CRITICAL)
    targets = FuzzTargets()
    started = time.monotonic()

    door = None if args.door is None else bytes([TARGETS.index(args.door)])

    def one(data: bytes) -> None:
        if door is not None:
            data = door + data[1:]
            try:
                targets.one(data)
            except BaseException:
                # the engine writes the input it gave; this one is the input the door got
                name = f"crash-{args.door}-{hashlib.sha1(data).hexdigest()}"
                with open(os.path.join(work, name), "wb") as f:
                    f.write(data)
                raise
        else:
            targets.one(data)
        if targets.inputs % 100_000 == 0:
            # the engine ends the process itself (no atexit): report as we go
            elapsed = time.monotonic() - started
            print(f"shm fuzz: {targets.inputs} inputs in {elapsed:.0f}s "
                  f"({targets.inputs / max(elapsed, 1e-9):.0f}/s), 0 crashes; by door: "
                  f"{targets.by_target}", flush=True)

    engine_args = [sys.argv[0], f"-runs={args.runs}", f"-seed={args.seed}",
                   f"-max_len={args.max_len}", f"-artifact_prefix={work}/",
                   "-print_final_stats=1", work]
    if os.path.isdir(args.corpus):
        engine_args.append(args.corpus)
    atheris.instrument_all()
    atheris.Setup(engine_args, one)
    atheris.Fuzz()  # exits the process: 0 when the runs are done, non-zero on a crash
    return 0


if __name__ == "__main__":
    sys.exit(main())
