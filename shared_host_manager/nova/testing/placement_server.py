"""placement as the simulator's nova mode runs it (``shm sim --scheduler nova``).

:func:`placement_app` is openstack-placement's WSGI app on its own database, configured as
the simulator needs it; :class:`PlacementClient` reaches it through keystoneauth, as nova's
report client does.  Two ways to serve it:

* :class:`InProcessPlacement` (the default): the app in the run's process, behind
  wsgi-intercept.  Every party of the run then shares placement's CPU and GIL.
* :class:`PlacementProcesses` (``--placement-processes N``): in a deployment placement runs
  under uWSGI in processes apart from the schedulers; this stands in for it:

    __init__:  the schema is created or upgraded here, once; a listening socket on
               127.0.0.1 (any free port) is made and N worker processes are started
               (``python -m shared_host_manager.nova.testing.placement_server FD URL``),
               each serving placement's WSGI app on that socket, a thread per request
               (the kernel hands each connection to one of them, as uWSGI's processes share
               their socket); it returns once placement answers
    adapter(), request():  keystoneauth on ``http://127.0.0.1:PORT`` (PlacementClient)
    cpu_seconds():  the workers' CPU time so far (user + system, from /proc)
    close():   the workers are terminated (then killed after 10 s); a worker whose run
               was killed ends by itself within a second

  Several processes write one database, so it has to be a server: MariaDB or PostgreSQL
  (SQLite has one writer, which the in-process placement serialises for it).
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid as uuid_mod
from typing import Any
from wsgiref import simple_server

#: how long the workers have to answer their first request
READY_TIMEOUT = 120.0


def placement_app(db_url: str, *, sync: bool = True) -> tuple[Any, Any]:
    """(placement's configuration, its WSGI app) on ``db_url``, as the simulator runs it: no
    auth, one claim attempt per request (below); ``sync``: create or upgrade the schema."""
    from oslo_config import cfg
    from placement import conf as placement_conf
    from placement import db_api, deploy

    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    conf.set_override("connection", db_url, group="placement_database")
    conf.set_override("sync_on_startup", sync, group="placement_database")
    if db_url.startswith("sqlite"):
        # a simulation's database: no fsync per commit (placement commits every consumer
        # of a POST /allocations apart: setting up a prefilled 1 000-node cloud took tens
        # of minutes on a busy disk)
        conf.set_override("sqlite_synchronous", False, group="placement_database")
    conf.set_override("auth_strategy", "noauth2", group="api")
    # placement retries a claim that lost a provider generation race inside the request's
    # own transaction, where the retry still sees its failed attempt's allocation rows (its
    # "no worse than before" exemption then passes any amount) and, on REPEATABLE READ, the
    # transaction's first snapshot: concurrent claims overcommit (docs/limits.md;
    # tests/nova/test_placement_claims.py).  One attempt per request: the conflict goes back
    # to nova as 409 placement.concurrent_update, and nova's report client retries the whole
    # claim in a new transaction.
    conf.set_override("allocation_conflict_retry_count", 1, group="placement")
    conf([], project="placement", default_config_files=[], default_config_dirs=[])
    db_api.configure(conf)
    return conf, deploy.loadapp(conf)


class PlacementClient:
    """keystoneauth Adapters on placement at :attr:`url` (the adapter names the endpoint
    itself: no keystone catalogue is consulted)."""

    url: str

    def __init__(self) -> None:
        import requests
        from keystoneauth1 import session

        self._session = requests.Session()
        self._ksa_session = session.Session(auth=None, session=self._session,
                                            additional_headers={"x-auth-token": "admin"})

    def adapter(self) -> Any:
        """A new Adapter (one per client: nova's report client keeps one)."""
        from keystoneauth1 import adapter

        return adapter.Adapter(self._ksa_session, service_type="placement",
                               endpoint_override=self.url, raise_exc=False)

    def request(self, method: str, path: str, body: Any = None, version: str = "1.36") -> Any:
        resp = self.adapter().request(path, method, json=body, microversion=version)
        if resp.status_code >= 400:
            raise RuntimeError(f"placement {method} {path}: {resp.status_code} {resp.text[:300]}")
        return resp.json() if resp.content else None

    def cpu_seconds(self) -> float | None:
        """placement's CPU time so far in processes of its own (None: it runs in this one)."""
        return None

    def close(self) -> None:
        self._session.close()


class InProcessPlacement(PlacementClient):
    """openstack-placement's WSGI app on its own database, in this process.

    wsgi-intercept routes requests for :attr:`url` to the app in this process
    (no socket), as ``placement.direct.PlacementDirect`` does.  Every party of the run
    then shares placement's CPU and GIL (``--placement-processes``: :class:`PlacementProcesses`).
    """

    def __init__(self, db_url: str) -> None:
        from wsgi_intercept import interceptor

        self.conf, inner = placement_app(db_url)
        if db_url.startswith("sqlite"):
            # SQLite has one writer: a transaction that read before writing fails at once
            # ("database is locked") if another wrote meanwhile, where a server would wait
            # for the row lock.  Writes wait for each other here instead.
            write_lock = threading.Lock()

            def app(environ: dict[str, Any], start_response: Any) -> Any:
                if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
                    return inner(environ, start_response)
                with write_lock:
                    return list(inner(environ, start_response))
        else:
            app = inner
        self.url = f"http://placement-{uuid_mod.uuid4().hex}/placement"
        self._intercept = interceptor.RequestsInterceptor(lambda: app, url=self.url)
        self._intercept.__enter__()
        super().__init__()

    def close(self) -> None:
        super().close()
        self._intercept.__exit__(None, None, None)


class PlacementProcesses(PlacementClient):
    """placement's WSGI app served by ``processes`` worker processes on ``db_url``."""

    def __init__(self, db_url: str, processes: int) -> None:
        if processes < 1:
            raise ValueError("placement processes must be at least 1")
        if db_url.startswith("sqlite"):
            raise ValueError("placement in processes of its own needs a database server "
                             "(--db-url mysql+pymysql://... or postgresql://...), not SQLite")
        placement_app(db_url, sync=True)  # the schema, once, before any worker reads it
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        fd = self._sock.fileno()
        self._workers = [
            subprocess.Popen([sys.executable, "-m", __name__, str(fd), db_url], pass_fds=(fd,),
                             stdout=subprocess.DEVNULL)
            for _ in range(processes)]
        super().__init__()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            dead = [w for w in self._workers if w.poll() is not None]
            if dead:
                self.close()
                raise RuntimeError(f"a placement worker exited with {dead[0].returncode} "
                                   "before serving (its error is above)")
            try:
                self.request("GET", "/")
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"placement workers did not answer within "
                                       f"{READY_TIMEOUT:.0f} s") from None
                time.sleep(0.2)

    def cpu_seconds(self) -> float:
        """The workers' CPU time so far (user + system, seconds)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for w in self._workers:
            try:
                with open(f"/proc/{w.pid}/stat", encoding="ascii") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def close(self) -> None:
        super().close()
        for w in self._workers:
            if w.poll() is None:
                w.terminate()
        for w in self._workers:
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        self._sock.close()


class _Server(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


class _QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base's name
        pass


def _exit_with(parent: int) -> None:
    """End this worker when the run that started it is gone (killed: no close() came)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def serve(fd: int, db_url: str) -> None:
    """One worker: placement's app on the inherited listening socket ``fd``, until killed
    or its parent is gone."""
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    _, app = placement_app(db_url, sync=False)
    server = _Server(("127.0.0.1", 0), _QuietHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=fd)
    server.server_address = server.socket.getsockname()
    server.server_name, server.server_port = "127.0.0.1", server.server_address[1]
    server.setup_environ()
    server.set_app(app)
    server.serve_forever(poll_interval=0.5)


__all__ = ["InProcessPlacement", "PlacementClient", "PlacementProcesses", "placement_app", "serve"]


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)  # not its warnings: a refused claim is normal here
    serve(int(sys.argv[1]), sys.argv[2])
