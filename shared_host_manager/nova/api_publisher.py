"""The API-side source's publisher in nova-api and nova-conductor processes.

Role
----
:mod:`.api_source` says *what* the API side publishes; this module runs it in a
process of nova's: it picks the source's name, loads what existed before the
process started, starts the reporter that publishes, makes an API call wait
until its change is on the stream, and says goodbye when the process stops.

Life cycle (one :class:`ApiPublisher` per process, :func:`publisher`)::

    installed --ensure_started() in a process whose pid it has not started in-->
        take the lowest free slot (a lock file)   name: <[reporter] name>-<role>-<slot>
        ApiStateSource.preload(database records)  services and aggregates, stamped
        ReporterService.start()                   a new epoch of that source
        api_source.install(source)                nova's objects publish to it
    running --stop() (nova's Service.stop, uWSGI's or Python's atexit)--> goodbye

Why each step is where it is:

* **After the fork.** uWSGI (without ``lazy-apps``) and oslo.service's process
  launcher import the application or build the service in a parent and fork
  workers; a connection or thread made before the fork belongs to the parent.
  So nothing starts at import: the WSGI wrapper calls :meth:`ensure_started`
  on every request (a pid comparison) and from uWSGI's post-fork hook, the
  conductor from its service's ``start`` in the worker.  A child that
  inherited a started publisher starts its own.
* **Stable names.** A source has a single writer, so every process needs a name
  of its own; named by pid, every restart left a source behind, held as down
  forever, and no key file could name it.  A slot is the lowest number whose lock
  file (``fcntl.flock``) no live process of the host holds: a restarted worker
  takes its slot again and announces a new epoch of the same source (design §3),
  and ``N`` workers use the names ``...-0`` to ``...-(N-1)``, which a signing key
  file can list in advance (``shm keys``).
* **Preload.** A new epoch's document replaces the old one in every scheduler;
  an empty one would drop a force-down the previous process published.  The
  services and aggregates read from nova's databases are stamped with their
  records' ``updated_at``, so a newer change by another API process still wins
  the schedulers' merge (:class:`.api_source.ApiState`).
* **Threads deaf to stop signals.** uWSGI's workers exit from inside the C
  handler of SIGINT or SIGTERM, in whichever thread received it; the reporter's
  threads (and the executors the preload starts) block those signals, and so do
  the threads nova starts while it answers a request (each request runs with
  them blocked: :func:`wsgi_application`), so the main thread receives them and
  a stopped nova-api worker exits at once after its goodbye instead of waiting
  for uWSGI's ``worker-reload-mercy`` to kill it.
  Once the exit has begun, further stop signals wait (each stop signal's handler
  masks all four) and are then ignored, so that the goodbye is not cut off by the
  next one; and uWSGI runs Python's after-fork handlers in each worker
  (``py-call-osafterfork``), or the worker's exit waits for threads it inherited
  from the master (nova's API starts an executor there) that never run in it.
* **Read your writes.** A change made by an API call goes to the stream at once
  (not after the coalesce window); once the broker has it, a fence of the
  source's new version is fanned out to every scheduler, and then the call
  returns (``[shared_host_manager] api_publish_timeout``).  A scheduler holds
  its next decision until it has applied the fenced version (``[cache]
  fence_timeout``), so a build requested after the call returned never lands
  on a service the call disabled, forced down or deleted, however far behind
  the scheduler's stream is.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

LOG = logging.getLogger(__name__)

#: the roles of an API-side process, and the word each puts in its source's name
ROLES = {"nova-api": "api", "nova-conductor": "conductor"}


def take_slot(lock_dir: str, base: str, *, limit: int = 1024) -> tuple[int, int]:
    """The lowest slot ``n`` whose lock file ``<lock_dir>/<base>-<n>.lock`` this process
    could lock, and the open descriptor that holds it (the lock goes with the process)."""
    os.makedirs(lock_dir, exist_ok=True)
    for slot in range(limit):
        path = os.path.join(lock_dir, f"{base}-{slot}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        os.set_inheritable(fd, False)
        return slot, fd
    raise RuntimeError(f"no free API-side source slot among {limit} in {lock_dir}")


def load_from_nova() -> tuple[list[Any], list[Any]]:
    """Every nova-compute service (in every cell this process reaches) and every aggregate,
    read from nova's databases; what cannot be read is logged and left out."""
    from nova import context as nova_context
    from nova import objects

    ctxt = nova_context.get_admin_context()
    services: list[Any] = []
    try:
        results = nova_context.scatter_gather_skip_cell0(
            ctxt, objects.ServiceList.get_by_binary, "nova-compute", include_disabled=True)
        for cell, result in results.items():
            if nova_context.is_cell_failure_sentinel(result):
                LOG.warning("API-side source: the services of cell %s are not readable", cell)
            else:
                services.extend(result)
    except Exception:  # a cell conductor has no API database: its own cell only
        try:
            services = list(objects.ServiceList.get_by_binary(ctxt, "nova-compute",
                                                              include_disabled=True))
        except Exception:
            LOG.exception("API-side source: compute services not readable; published as changed")
    aggregates: list[Any] = []
    try:
        aggregates = list(objects.AggregateList.get_all(ctxt))
    except Exception:
        LOG.warning("API-side source: aggregates not readable here (no API database); "
                    "published as changed", exc_info=True)
    return services, aggregates


#: the signals that stop a uWSGI worker: uWSGI's C handlers exit the process from whichever
#: thread the kernel delivers them to, and a process exiting from a thread other than the
#: main one waits for the main thread at interpreter shutdown until uWSGI kills it
#: (``worker-reload-mercy``, 60 s by default) after the goodbye
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP})


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Block :data:`STOP_SIGNALS` in this thread for the block: every thread started in it (the
    reporter's, and those of the executors the preload's reads start) inherits the mask and
    never receives them; this thread's mask is restored after (a signal that arrived meanwhile
    is delivered then)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@functools.cache
def _libc() -> Any:
    """The C library, for the signal calls Python's ``signal`` module does not offer."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return libc


def ignore_stop_signals() -> None:
    """Ignore :data:`STOP_SIGNALS` in the whole process from now on: called once uWSGI's worker
    has begun to exit.  A process group stopped at once (systemd's ``KillMode=control-group``)
    gives each worker SIGTERM and then the master's SIGINT; the second, handled by uWSGI's C
    handler, calls ``exit()`` again inside the first and ends the worker in the middle of its
    goodbye.  Python's ``signal.signal`` works only in the main thread, and the exit may have
    begun in another: the C library's ``signal`` sets the disposition from any thread."""
    libc = _libc()
    for sig in STOP_SIGNALS:
        libc.signal(int(sig), ctypes.c_void_p(int(signal.SIG_IGN)))


class _SigAction(ctypes.Structure):
    """The C library's ``struct sigaction`` (glibc on Linux, x86-64 and AArch64)."""
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


def _sigaction(sig: int) -> _SigAction | None:
    """The process's current action for ``sig`` (None: not readable)."""
    act = _SigAction()
    return act if _libc().sigaction(sig, None, ctypes.byref(act)) == 0 else None


def stop_handler() -> int | None:
    """The address of the process's SIGTERM handler (None: the default; 1: ignored)."""
    if not sys.platform.startswith("linux"):
        return None
    act = _sigaction(int(signal.SIGTERM))
    return None if act is None else act.handler


def mask_stop_signals_in_handlers() -> list[int]:
    """Install each stop signal's handler again with every stop signal in its mask; the
    signals whose handler was changed.  uWSGI installs its worker's with an empty mask, and
    its handler exits the process from inside itself, so a second stop signal arriving before
    the at-exit hook has run (the master's SIGINT, after systemd's SIGTERM to the whole group)
    starts the exit again from inside it and ends the worker without its goodbye.  With the
    mask, the second one waits while the first handler runs, that is until the process is
    gone.  Handlers other than functions (the default, ignored) are left as they are."""
    if not sys.platform.startswith("linux"):
        return []
    libc = _libc()
    changed = []
    for sig in sorted(STOP_SIGNALS):
        act = _sigaction(int(sig))
        if act is None or act.handler in (None, int(signal.SIG_IGN)):
            continue
        for other in STOP_SIGNALS:
            libc.sigaddset(ctypes.byref(act, _SigAction.mask.offset), int(other))
        if libc.sigaction(int(sig), ctypes.byref(act), None) == 0:
            changed.append(int(sig))
    return changed


def mask_stop_signals_once_installed(initial: int | None, *, timeout: float = 120.0,
                                     interval: float = 0.005) -> threading.Thread:
    """A thread that applies :func:`mask_stop_signals_in_handlers` once the SIGTERM handler
    is no longer ``initial`` (or after ``timeout`` seconds): uWSGI installs its worker's
    handlers after running the post-fork hooks, the only place Python code runs in every
    worker before its first request, and only once those hooks have returned (the
    publisher's start among them: database reads and a broker connection, seconds on a
    busy host).  The thread blocks the stop signals itself."""
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while stop_handler() == initial and time.monotonic() < deadline:
            time.sleep(interval)
        changed = mask_stop_signals_in_handlers()
        LOG.debug("stop signals %s masked in their own handlers", changed)

    with stop_signals_blocked():
        thread = threading.Thread(target=watch, name="shm-stop-signal-mask", daemon=True)
        thread.start()
    return thread


class ApiPublisher:
    """This process's API-side source and its reporter (see the module docstring)."""

    def __init__(self, role: str, stream_conf: Callable[[], Any], *,
                 publish_timeout: float = 2.0, lock_dir: str | None = None,
                 load: Callable[[], tuple[Iterable[Any], Iterable[Any]]] = load_from_nova) -> None:
        if role not in ROLES:
            raise ValueError(f"API-side role must be one of {sorted(ROLES)}, not {role!r}")
        self.role = role
        self._stream_conf = stream_conf
        self.publish_timeout = publish_timeout
        self.lock_dir = lock_dir
        self._load = load
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._slot_fd: int | None = None
        self.reporter: Any = None
        self.source: Any = None

    @property
    def started_in(self) -> int | None:
        """The pid of the process the publisher runs in (None: not started)."""
        return self._pid

    @property
    def name(self) -> str | None:
        return None if self.source is None else self.source.source

    def ensure_started(self) -> Any:
        """This process's running reporter, started on the first call in each process."""
        pid = os.getpid()
        if self._pid == pid:
            return self.reporter
        with self._lock:
            if self._pid != pid:
                with stop_signals_blocked():
                    self._start(pid)
        return self.reporter

    def _start(self, pid: int) -> None:
        from compute_reporter import service as reporter_service
        from shared_host_manager.nova import api_source

        # inherited from a parent that had started: its threads and connections are not ours
        self.reporter = self.source = None
        if self._slot_fd is not None:
            os.close(self._slot_fd)
            self._slot_fd = None
        conf = self._stream_conf()
        base = f"{conf.reporter.name}-{ROLES[self.role]}"
        lock_dir = self.lock_dir or conf.reporter.state_dir or tempfile.gettempdir()
        slot, self._slot_fd = take_slot(lock_dir, base)
        name = f"{base}-{slot}"
        conf.set_override("name", name, group="reporter")
        source = api_source.ApiStateSource(name, role=self.role)
        services, aggregates = self._load()
        source.preload(services, aggregates)
        reporter = reporter_service.service_from_conf(conf, source)
        reporter.start()
        if self.publish_timeout > 0:
            timeout = self.publish_timeout
            source.confirm = lambda: reporter.publish_now(timeout, fence=True)
        api_source.install(source)
        self.source, self.reporter, self._pid = source, reporter, pid
        LOG.info("API-side source %s publishing (%s, pid %d)", name, self.role, pid)

    def stop(self) -> None:
        """Say goodbye (its document stays applied: the changes it tells stay made)."""
        with self._lock:
            reporter, pid = self.reporter, self._pid
            if reporter is None or pid != os.getpid():
                return
            self.reporter = None
            self._pid = None
            fd, self._slot_fd = self._slot_fd, None
        try:
            reporter.stop()
        except Exception:  # a process on its way out: say what failed, do not mask its exit
            LOG.exception("API-side source: the goodbye was not published")
        finally:
            if fd is not None:
                os.close(fd)  # the slot, for this process's successor


_publisher: ApiPublisher | None = None


def publisher() -> ApiPublisher | None:
    """This process's API-side publisher (None: :func:`install` was not called)."""
    return _publisher


def install(role: str, stream_conf: Callable[[], Any], *, publish_timeout: float,
            lock_dir: str | None) -> ApiPublisher:
    """Make this process (and every child it forks) publish its API-side changes; the
    publisher starts on its first :meth:`ApiPublisher.ensure_started` in each process
    and says goodbye at exit (Python's ``atexit``, and uWSGI's where uWSGI runs it)."""
    global _publisher
    if _publisher is None:
        _publisher = ApiPublisher(role, stream_conf, publish_timeout=publish_timeout,
                                  lock_dir=lock_dir)
        atexit.register(_publisher.stop)
        try:
            import uwsgi  # only inside uWSGI

            previous = getattr(uwsgi, "atexit", None)

            def at_exit() -> None:
                ignore_stop_signals()
                if _publisher is not None:
                    _publisher.stop()
                if callable(previous):
                    previous()

            uwsgi.atexit = at_exit
            from uwsgidecorators import postfork

            publisher_ = _publisher

            def start_after_fork() -> None:
                mask_stop_signals_once_installed(stop_handler())
                # a broker down at fork time must not take the worker down: the WSGI
                # wrapper tries again on the worker's requests
                try:
                    publisher_.ensure_started()
                except Exception:
                    LOG.exception("API-side source not started after the fork; the worker's "
                                  "requests try again")

            postfork(start_after_fork)
        except ImportError:
            pass
    return _publisher


#: seconds between two attempts to start a publisher that failed to start in a WSGI worker
RETRY_INTERVAL = 10.0


class _ResponseBody:
    """An application's response body, with ``done`` called once the server has closed it
    (after sending it, as WSGI's ``close`` is called)."""

    def __init__(self, body: Iterable[bytes], done: Callable[[], None]) -> None:
        self._body = body
        self._done: Callable[[], None] | None = done

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


def wsgi_application(app: Callable[..., Any], publisher_: ApiPublisher, *,
                     clock: Callable[[], float] = time.monotonic) -> Callable[..., Any]:
    """``app``, with this process's publisher started before its first request.  A publisher
    that cannot start (the broker unreachable) is logged and tried again every
    :data:`RETRY_INTERVAL` seconds; nova's API keeps answering meanwhile.

    Stop signals and nova's threads: a signal sent to the process lands in any thread that
    does not block it, and uWSGI's handler exits from the thread it lands in.  nova's
    executors start their threads on demand, from the thread that submits work, that is
    inside a request; so a request runs with :data:`STOP_SIGNALS` blocked, every thread it
    starts inherits the block, and the worker's main thread stays the only one that can
    take a stop signal.  Without it the master's SIGINT, arriving while the main thread
    handles the group's SIGTERM (its own handler masks the second), lands in one of nova's
    threads and exits the worker a second time, concurrently, before its goodbye.  A stop
    signal that arrives during a request is taken once its answer is sent.  The first
    request in each worker also masks the stop signals in their handlers (uWSGI installed
    its worker's by then), should the post-fork watcher not have."""
    next_try = [0.0]
    handlers_masked_in = [0]

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        pid = os.getpid()
        if handlers_masked_in[0] != pid:
            handlers_masked_in[0] = pid
            mask_stop_signals_in_handlers()
        if publisher_.reporter is None or publisher_.started_in != pid:
            now = clock()
            if now >= next_try[0]:
                try:
                    publisher_.ensure_started()
                except Exception as exc:
                    next_try[0] = now + RETRY_INTERVAL
                    LOG.error("API-side source not started (%s): service and aggregate changes "
                              "of this process do not reach the schedulers; trying again in "
                              "%.0f s", exc, RETRY_INTERVAL)
        blocked = contextlib.ExitStack()
        blocked.enter_context(stop_signals_blocked())
        try:
            body = app(environ, start_response)
        except BaseException:
            blocked.close()
            raise
        return _ResponseBody(body, blocked.close)
    return application


__all__ = ["ROLES", "ApiPublisher", "install", "load_from_nova", "publisher", "take_slot",
           "wsgi_application"]
