"""A TCP relay in front of the broker: a cell's broker that can be stopped and started.

On one machine every cell's stream lives on the one local RabbitMQ; a cell whose
clients connect through a relay loses its broker when the relay stops (every
connection through it closed, new ones refused) and gets it back when it starts,
on the same port, while the other cells' connections are untouched.  The simulator's
``--cell-outage`` and the cells' integration test use it.

Life cycle::

    Relay(upstream) --start()--> relaying --stop()--> refusing --start()--> relaying ...
"""

from __future__ import annotations

import socket
import threading

__all__ = ["Relay"]


class Relay:
    """A TCP relay to ``upstream`` on a fixed local port (:attr:`port`): stop() closes every
    connection and refuses new ones (the cell's broker is gone), start() accepts again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass
