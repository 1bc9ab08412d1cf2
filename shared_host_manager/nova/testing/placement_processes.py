"""placement served from processes of its own, for ``shm sim --scheduler nova --placement-processes N``.

In a deployment placement runs under uWSGI in processes apart from the schedulers; in
one simulated process (:class:`~shared_host_manager.nova.testing.simulation.InProcessPlacement`)
its queries and claims share the GIL and the CPU of every scheduler, compute and client
of the run.  :class:`PlacementProcesses` stands in for the deployment's placement:

    __init__:  the schema is created or upgraded here, once; a listening socket on
               127.0.0.1 (any free port) is made and N worker processes are started
               (``python -m shared_host_manager.nova.testing.placement_processes FD URL``),
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
from typing import Any
from wsgiref import simple_server

from shared_host_manager.nova.testing.simulation import PlacementClient, placement_app

LOG = logging.getLogger(__name__)
#: how long the workers have to answer their first request
READY_TIMEOUT = 120.0


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


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)  # not its warnings: a refused claim is normal here
    serve(int(sys.argv[1]), sys.argv[2])
