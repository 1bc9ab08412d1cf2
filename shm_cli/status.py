"""``shm status URL [URL ...]``: several running processes side by side, and ``--verify``.

Each URL is a process's metrics endpoint (``http://HOST:PORT``, or just
``HOST:PORT``): ``shm reporter``, ``shm scheduler``, ``nova-compute-shared``,
``nova-scheduler-shared``.  ``shm status`` reads their ``/status`` and prints
one table, a column per process: health, broker connection, sources, stream
offset and lag, staleness, what was published, resyncs, claims, invalid input;
``shm placement-feed``'s providers and last poll, and each scheduler's copy of
them ("placement view": providers, last heard, STALE or no feed).

``--verify`` is the operator's convergence check: it reads every source's
``(epoch, seq, digest)`` from each reporter (what it published), then from each
scheduler (what it holds), and checks that every scheduler holds every
reporter's source at or after the version the reporter had published at its
read, and the same document wherever both are seen at one version with known
digests (:class:`Convergence`).  Sources a scheduler does not hold yet are
read again every ``--interval`` seconds for up to ``--timeout``, against what
the reporter had published one read earlier, so that normal churn (a delta in
flight, a change not yet published) is not reported; the sources that never
agreed are named, with what each party holds.

Exit status: 0 all reachable (and, with --verify, converged); 1 a process is
unhealthy (with --verify: once the verification ended, so that a scheduler still
starting when it began is not counted) or, with --verify, sources differ; 2
usage, or a process could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from rich.console import Console
from rich.table import Table

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2
#: processes that publish sources (the placement feed publishes one: placement's providers)
REPORTER_ROLES = ("reporter", "nova-compute", "placement-feed")
SCHEDULER_ROLES = ("scheduler", "nova-scheduler")


def build_parser(prog: str = "shm status") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 ok, 1 unhealthy or not converged, 2 usage or "
                                       "unreachable.")
    p.add_argument("urls", nargs="+", metavar="URL",
                   help="metrics endpoint of a process: http://HOST:PORT or HOST:PORT")
    p.add_argument("--verify", action="store_true",
                   help="check that every scheduler holds every reporter's sources at or after "
                        "the published (epoch, seq), with the same digest at the same version")
    p.add_argument("--timeout", type=float, default=15.0, metavar="S",
                   help="--verify: seconds to wait for sources in flight to agree (default 15)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="--verify: seconds between two reads (default 1)")
    p.add_argument("--limit", type=int, default=20, metavar="N",
                   help="--verify: name at most N differing sources (default 20; 0: all)")
    p.add_argument("--json", action="store_true", help="print what was read, as JSON")
    return p


def endpoint(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    for suffix in ("/status", "/metrics", "/healthz"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def fetch(url: str, sources: bool = False, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/status{'?sources=1' if sources else ''}",
                                timeout=timeout) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


# -- the table --------------------------------------------------------------------------------


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "-"
    s = max(0.0, now - t)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _num(v: Any, fmt: str = "") -> str:
    if v is None:
        return "-"
    return format(v, fmt) if fmt else str(v)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _placement_view(view: dict[str, Any]) -> str:
    """A scheduler's copy of placement (the placement feed's source), one line."""
    if view.get("reason") == "no_feed":
        return "no feed"
    line = f"{view.get('providers', 0)} providers, heard {_age(view.get('last_heard'))} ago"
    if view.get("reason") == "stale":
        return f"[red]STALE[/red] {line}"
    return line


def _rows(st: dict[str, Any]) -> dict[str, str]:
    now = st.get("now") or time.time()
    rows: dict[str, str] = {}
    rows["role"] = st.get("role", "?")
    rows["health"] = "[green]ok[/green]" if st.get("healthy") else \
        f"[red]UNHEALTHY[/red] {st.get('health', '')}"
    rows["up"] = _ago(st.get("started_at"), now)
    broker = st.get("broker")
    if broker is None:
        rows["broker"] = "in-process"
    else:
        state = "[green]connected[/green]" if broker.get("connected") else "[red]DISCONNECTED[/red]"
        rows["broker"] = f"{state} {_ago(broker.get('since'), now)}; {broker.get('reconnects', 0)} reconnects"
    src = st.get("sources", {})
    if "served" in src:
        rows["sources"] = f"{src['served']} served"
    else:
        rows["sources"] = (f"{src.get('held', 0)} held, {src.get('active', 0)} active, "
                           f"{src.get('down', 0)} down, {src.get('syncing', 0)} syncing")
    stream = st.get("stream")
    if stream:
        applied, tail = _num(stream.get("applied_offset")), _num(stream.get("tail_offset"))
        rows["stream offset"] = f"{applied} / tail {tail}"
        lag_s = stream.get("lag_seconds")
        rows["lag"] = "-" if stream.get("lag_offsets") is None else \
            f"{stream['lag_offsets']} offsets, {'-' if lag_s is None else f'{lag_s:.2f} s'}"
        stale = stream.get("staleness") or {}
        p50, p99 = stale.get("p50_le"), stale.get("p99_le")
        rows["staleness"] = "-" if not stale.get("count") else \
            f"p50 <= {_num(p50, 'g')} s, p99 <= {_num(p99, 'g')} s"
    for cell, c in (st.get("cells") or {}).items():
        # one row per cell stream (design §4.6): its broker, offset, lag and staleness
        link = "-" if c.get("connected") is None else "connected" if c["connected"] else \
            f"[red]DISCONNECTED[/red] {_ago(c.get('since'), now)}"
        lag_s, stale = c.get("lag_seconds"), c.get("staleness") or {}
        rows[f"cell {cell}"] = (
            f"{link}; offset {_num(c.get('applied_offset'))}, lag "
            f"{'-' if lag_s is None else f'{lag_s:.2f} s'}, staleness p99 "
            f"{'-' if not stale.get('count') else '<= ' + _num(stale.get('p99_le'), 'g') + ' s'}")
    pub = st.get("published")
    if pub:
        rows["published"] = (f"{pub['batches']} batches: {pub['deltas']} deltas, {pub['heartbeats']} "
                             f"heartbeats")
        rows["publish failures"] = (f"{pub['failures']} not stored, {pub.get('unconfirmed', 0)} "
                                    f"unconfirmed, {pub['retries']} retries")
        rows["changes"] = str(st.get("changes", 0))
    rx = st.get("receiver")
    if rx:
        rows["applied"] = f"{rx['applied']} deltas"
        rows["gaps / digest mismatches"] = f"{rx['gaps']} / {rx['digest_mismatches']}"
        rows["resyncs"] = f"{rx['resync_requests']} requested, {rx['resync_answers']} answered"
    elif "resyncs" in st:
        rows["resyncs"] = f"{st['resyncs']['requested']} requested, {st['resyncs']['answered']} answered"
    claims = st.get("claims") or {}
    rows["claims"] = ", ".join(f"{k} {v}" for k, v in claims.items() if v) or "-"
    decisions = {k: v for k, v in (st.get("decisions") or {}).items() if k != "seconds"}
    if decisions:
        sec = (st.get("decisions") or {}).get("seconds") or {}
        rows["decisions"] = ", ".join(f"{k} {v}" for k, v in decisions.items()) + \
            f" (p99 <= {_num(sec.get('p99_le'), 'g')} s)"
    invalid = st.get("invalid") or {}
    rows["invalid input"] = ", ".join(f"{k} {v}" for k, v in sorted(invalid.items())) or "-"
    feed = st.get("placement_feed")
    if feed:
        rows["placement feed"] = (f"{feed['providers']} providers, last poll "
                                  f"{_age(feed.get('last_poll_age'))} ago; {feed.get('dirty', 0)} "
                                  f"dirty, {feed.get('errors', 0)} failed polls")
        over = feed.get("over_capacity_providers") or {}
        if over:
            rows["placement feed"] += (f"; [red]over capacity: {', '.join(sorted(over)[:3])}"
                                       f"{' ...' if len(over) > 3 else ''}[/red]")
    view = st.get("placement")
    if view:
        rows["placement view"] = _placement_view(view)
    local = st.get("state") or {}
    if local.get("last_error"):
        rows["state_dir"] = f"[red]{local['last_error']}[/red]"
    return rows


def table(urls: list[str], statuses: list[dict[str, Any] | str]) -> Table:
    t = Table(show_header=True, header_style="bold", title="shm status")
    t.add_column("", style="bold")
    columns: list[dict[str, str]] = []
    for url, st in zip(urls, statuses, strict=True):
        if isinstance(st, str):
            t.add_column(url.split("://", 1)[-1])
            columns.append({"health": f"[red]UNREACHABLE[/red] {st}"})
        else:
            t.add_column(f"{st.get('name', '?')}\n{url.split('://', 1)[-1]}", overflow="fold")
            columns.append(_rows(st))
    names: list[str] = []
    for col in columns:
        names.extend(n for n in col if n not in names)
    for name in names:
        t.add_row(name, *(col.get(name, "") for col in columns))
    return t


# -- --verify ---------------------------------------------------------------------------------


def _version(v: list[Any] | None) -> str:
    if v is None:
        return "absent"
    digest = v[2][:12] if len(v) > 2 and v[2] else "pending"
    return f"{v[0]}:{v[1]} {digest}"


class Convergence:
    """What ``--verify`` has concluded so far, fed one round of reads at a time (no I/O, no
    clock: the unit tests drive it with scripted reads).

    A round reads every reporter first, then every scheduler.  A source *agrees* once every
    scheduler holds a version at or after the reporter's published version at the round's
    read -- the previous round's read when there was one: what was published a round ago has
    had that long to arrive, so a delta in flight at one read is not a divergence, and a
    scheduler still catching up is.  Versions order by (epoch, seq): a restarted source's
    newer epoch is after its old one.  Digests are compared wherever a reporter and a
    scheduler are seen at the same (epoch, seq) with both digests known, at any round (a
    reporter's digest is pending while it holds unpublished changes): the same version with
    different digests is a divergence whatever the versions say.
    """

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.rounds = 0
        self.sources: set[str] = set()
        self.agreed: set[str] = set()
        #: why a source does not agree yet (the last round), and divergences of content
        self.last: dict[str, str] = {}
        self.content: dict[str, str] = {}
        #: sources whose digests were compared (and matched) at some version
        self.compared: set[str] = set()
        self._previous: dict[str, list[Any]] = {}
        self._published: dict[tuple[str, int, int], tuple[str, str]] = {}  # -> (reporter, digest)
        self._held: dict[tuple[str, int, int], dict[str, str]] = {}  # -> {scheduler: digest}

    @property
    def pending(self) -> set[str]:
        return self.sources - self.agreed

    def observe(self, truth: dict[str, tuple[str, list[Any]]],
                held: dict[str, dict[str, list[Any]]]) -> None:
        """One round: ``truth`` each source's (reporter url, published [epoch, seq, digest])
        read first, then ``held`` each scheduler url's {source: [epoch, seq, digest, ...]}."""
        self.rounds += 1
        self.sources = set(truth)
        for source, (rurl, version) in truth.items():
            if version[2]:
                self._published[(source, version[0], version[1])] = (rurl, version[2])
                self._compare(source, version[0], version[1])
        for url, views in held.items():
            for source, mine in views.items():
                if source in self.sources and len(mine) > 2 and mine[2]:
                    self._held.setdefault((source, mine[0], mine[1]), {})[url] = mine[2]
                    self._compare(source, mine[0], mine[1])
        for source, (rurl, version) in truth.items():
            if source in self.agreed:
                continue
            target = self._previous.get(source, version)
            behind = [f"{self.names.get(url, url)} holds {_version(views.get(source))}"
                      for url, views in held.items()
                      if not _at_or_after(views.get(source), target)]
            if behind:
                self.last[source] = (f"{self.names.get(rurl, rurl)} at {_version(version)}"
                                     f"{'' if target is version else f' (read before: {_version(target)})'}"
                                     f"; " + ", ".join(behind))
            else:
                self.agreed.add(source)
                self.last.pop(source, None)
        self._previous = {source: version for source, (_, version) in truth.items()}

    def differ(self) -> list[str]:
        """The sources that do not agree, or whose documents differ at one version."""
        return sorted(self.pending | set(self.content))

    def _compare(self, source: str, epoch: int, seq: int) -> None:
        published = self._published.get((source, epoch, seq))
        held = self._held.get((source, epoch, seq))
        if published is None or not held:
            return
        rurl, digest = published
        for url, mine in held.items():
            if mine != digest:
                self.content[source] = (
                    f"{self.names.get(url, url)} holds {epoch}:{seq} {mine[:12]}, "
                    f"{self.names.get(rurl, rurl)} published {epoch}:{seq} {digest[:12]}: "
                    "same version, different documents")
                return
        self.compared.add(source)


def _at_or_after(mine: list[Any] | None, target: list[Any]) -> bool:
    return mine is not None and (mine[0], mine[1]) >= (target[0], target[1])


def verify(urls: list[str], timeout: float, interval: float, console: Console, limit: int) -> int:
    roles = {url: fetch(url).get("role", "?") for url in urls}
    reporters = [u for u in urls if roles[u] in REPORTER_ROLES]
    schedulers = [u for u in urls if roles[u] in SCHEDULER_ROLES]
    if not reporters or not schedulers:
        console.print("verify: give at least one reporter and one scheduler "
                      f"(got {', '.join(f'{u} ({r})' for u, r in roles.items())})")
        return EXIT_USAGE
    started = time.monotonic()
    names: dict[str, str] = {}
    state = Convergence(names)
    extra: set[str] = set()
    while True:
        # the reporters first: what a scheduler holds is compared with what was published
        # before it was read, never with what was published after
        truth: dict[str, tuple[str, list[Any]]] = {}
        for url in reporters:
            st = fetch(url, sources=True)
            names[url] = st.get("name", url)
            for source, version in st.get("views", {}).items():
                truth[source] = (url, version)
        held: dict[str, dict[str, list[Any]]] = {}
        for url in schedulers:
            st = fetch(url, sources=True)
            names[url] = st.get("name", url)
            held[url] = st.get("views", {})
        state.observe(truth, held)
        extra = {s for views in held.values() for s in views} - set(truth)
        if not state.pending or time.monotonic() - started >= timeout:
            break
        time.sleep(interval)
    elapsed = time.monotonic() - started
    differ = state.differ()
    rounds, total = state.rounds, len(state.sources)
    head = (f"verify: {total} sources of {len(reporters)} reporter(s), "
            f"{len(schedulers)} scheduler(s)")
    if not differ:
        console.print(f"{head}: [green]all {total} agree[/green]: every scheduler holds each "
                      f"source at or after the version its reporter had published, digests "
                      f"compared for {len(state.compared)} ({rounds} read{'s' * (rounds != 1)}, "
                      f"{elapsed:.1f} s)")
        if extra:
            console.print(f"  ({len(extra)} sources held by schedulers are served by reporters not "
                          "given here; not checked)")
        return EXIT_OK
    console.print(f"{head}: [red]{len(differ)} differ[/red] after {elapsed:.1f} s ({rounds} reads)")
    for source in differ if limit <= 0 else differ[:limit]:
        console.print(f"  {source}: {state.content.get(source) or state.last.get(source, '')}")
    if 0 < limit < len(differ):
        console.print(f"  ... and {len(differ) - limit} more (--limit 0 lists all)")
    return EXIT_DIFFERENT


def main(argv: list[str] | None = None, prog: str = "shm status") -> int:
    args = build_parser(prog).parse_args(argv)
    urls = [endpoint(u) for u in args.urls]
    # a table of several processes is wide: do not squeeze it into 80 columns when piped
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 60 + 34 * len(urls))
    statuses: list[dict[str, Any] | str] = []
    for url in urls:
        try:
            statuses.append(fetch(url))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            statuses.append(f"{reason}")
    if args.json:
        print(json.dumps(dict(zip(urls, statuses, strict=True)), indent=2, sort_keys=True))
    else:
        console.print(table(urls, statuses))
    unreachable = any(isinstance(s, str) for s in statuses)
    if unreachable:
        return EXIT_USAGE
    code = EXIT_OK if all(isinstance(s, dict) and s.get("healthy") for s in statuses) else EXIT_DIFFERENT
    if args.verify:
        try:
            verified = verify(urls, args.timeout, args.interval, console, args.limit)
            if verified != EXIT_USAGE:
                # the table is each process before the verification: one still starting then
                # (a restarted scheduler restoring its state) is judged as it is at the end
                code = _health_after(urls, console)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            console.print(f"verify: a process could not be read: {exc}")
            return EXIT_USAGE
        code = max(code, verified) if verified != EXIT_USAGE else EXIT_USAGE
    return code


def _health_after(urls: list[str], console: Console) -> int:
    """Each process's health read again once ``--verify`` is done; the unhealthy are named."""
    code = EXIT_OK
    for url in urls:
        st = fetch(url)
        if not st.get("healthy"):
            console.print(f"verify: {st.get('name', url)} is unhealthy: {st.get('health', '')}")
            code = EXIT_DIFFERENT
    return code


if __name__ == "__main__":
    sys.exit(main())
