"""Checks a process runs before it starts serving, and the one-line errors they raise.

An operator's mistake (a value with an inline comment, a required option left
out, a wrong password, a state directory that cannot be written) must end the
process within seconds with one line that names the option or file and what
to do -- not a traceback, not a hang, not a silent default.  Everything here
raises :class:`OperatorError`; the command line (``shm_cli.common``) prints its
message and exits with its ``exit_code`` (a traceback only with ``--debug``).

Exit codes (sysexits.h, so a systemd unit can tell them apart)::

    78 EX_CONFIG       configuration or local state, a login the broker refuses:
                       fix a file, do not restart
    69 EX_UNAVAILABLE  the broker could not be reached in time: restart later
     1                 anything unexpected

The ``shm`` services (``shm_cli.common``) and nova's (``shared_host_manager.nova.cmd``)
end alike: :func:`report_error` prints the line and gives the code.

Nothing here holds state; each check runs once, at start.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import tempfile
import threading
import time
import traceback
from urllib.parse import unquote, urlsplit

import amqp.exceptions
from kombu import Connection
from oslo_config import cfg

from transport.opts import register_cell_groups

__all__ = [
    "EX_CONFIG",
    "EX_SOFTWARE",
    "EX_UNAVAILABLE",
    "OperatorError",
    "broker_start_timeout_opt",
    "check_broker",
    "check_brokers",
    "check_conf_values",
    "check_state_dir",
    "describe_error",
    "kombu_urls_of",
    "report_error",
]

EX_SOFTWARE = 1
EX_UNAVAILABLE = 69
EX_CONFIG = 78

#: [DEFAULT] of every service's own configuration (``shm`` services, and the stream
#: configuration of nova's): how long the broker check at start waits for the broker
broker_start_timeout_opt = cfg.FloatOpt("broker_start_timeout", default=10.0, min=0.0, help="""
Seconds a starting service (shm reporter, shm scheduler,
nova-scheduler-shared, nova-compute-shared) keeps trying to log in to the
broker ([data_plane] stream_url, [control_plane] transport_url) before it
gives up with exit code 69 (a supervisor restarts it later). A refused
login (wrong user or password, unknown virtual host) fails at once with
exit code 78. Once started, a process rides out broker outages.
""")

#: whitespace then '#': the start of an inline comment, which oslo.config keeps in the value
_INLINE_COMMENT = re.compile(r"\s#")


class OperatorError(Exception):
    """A mistake the operator can fix, in one line, and the exit code it ends the process with."""

    def __init__(self, message: str, exit_code: int = EX_CONFIG) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- configuration values ---------------------------------------------------------------------

_LOCATION = re.compile(r"detail='([^']*)'")
_REASON = re.compile(r"is not valid: (.*)$", re.S)


def _where(conf: cfg.ConfigOpts, name: str, group: str | None) -> str:
    try:
        loc = conf.get_location(name, group)
    except Exception:  # noqa: BLE001 -- the value itself is broken; the caller names the file
        return ""
    detail = getattr(loc, "detail", None) if loc is not None else None
    return f" (in {detail})" if detail and os.sep in str(detail) else ""


def check_conf_values(conf: cfg.ConfigOpts, groups: list[str] | None = None) -> None:
    """Read every registered option once: a value that does not convert, or a string value
    holding an inline comment, is an :class:`OperatorError` naming the option and the file.
    ``groups``: only these groups' options (nova's own configuration holds one group of ours,
    and its other options are nova's to judge).

    oslo.config takes everything after ``=`` as the value, ``#`` included, so
    ``enabled = false  # ...`` fails to convert and, worse, ``name = compute-01  # ...``
    is accepted with the comment in the name.  We refuse both (comments belong on a line
    of their own) rather than guess where a value ends.
    """
    register_cell_groups(conf)  # [data_plane:<cell>] of each listed cell, read as the rest
    for key in list(conf) if groups is None else groups:
        value = _read(conf, None, key)
        if isinstance(value, cfg.ConfigOpts.GroupAttr):
            for name in list(value):
                _check_string(conf, key, name, _read(conf, key, name))
        else:
            _check_string(conf, None, key, value)


def _read(conf: cfg.ConfigOpts, group: str | None, name: str) -> object:
    label = f"[{group or 'DEFAULT'}]"
    try:
        return conf[group][name] if group is not None else conf[name]
    except cfg.ConfigFileValueError as exc:
        text = str(exc)
        file = _LOCATION.search(text)
        reason = _REASON.search(text)
        hint = ("; comments must be on a line of their own (oslo.config keeps an inline "
                "'# ...' in the value)") if "#" in text else ""
        raise OperatorError(
            f"{label} {name}: invalid value{' in ' + file.group(1) if file else ''}: "
            f"{reason.group(1).strip() if reason else text}{hint}") from exc
    except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
        return None


def _check_string(conf: cfg.ConfigOpts, group: str | None, name: str, value: object) -> None:
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str) and _INLINE_COMMENT.search(v):
            raise OperatorError(
                f"[{group or 'DEFAULT'}] {name} = {v!r}{_where(conf, name, group)}: the value holds "
                "an inline comment (oslo.config keeps everything after '='); put the comment on a "
                "line of its own")


# -- local state ----------------------------------------------------------------------------------


def check_state_dir(path: str, option: str) -> None:
    """``path`` is (or can be made) a directory this process can write, else OperatorError."""
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            raise OperatorError(f"{option} = {path}: a file is in the way, not a directory; "
                                "remove it or choose another directory")
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".shm-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OperatorError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            what = "a file is in the way of the directory"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            what = f"not writable by this user (uid {os.getuid()})"
        else:
            what = exc.strerror or str(exc)
        raise OperatorError(f"{option} = {path}: {what}; create it writable for the service's user "
                            "or choose another directory") from exc


# -- the broker -------------------------------------------------------------------------------------


def kombu_urls_of(transport_url: str) -> list[str]:
    """kombu URLs of the hosts of an oslo.messaging ``rabbit://`` transport URL
    (``rabbit://u:p@h1:5672,u:p@h2:5672/vhost``); [] for other drivers (``fake://``)."""
    parts = urlsplit(transport_url)
    if parts.scheme not in ("rabbit", "kombu", "amqp"):
        return []
    vhost = parts.path[1:] if parts.path.startswith("/") else parts.path
    urls = []
    for host in parts.netloc.split(","):
        urls.append(f"amqp://{host}/{vhost or '/'}")
    return urls


def _describe(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    user = unquote(parts.username or "guest")
    return f"{parts.hostname}:{parts.port or 5672}", user


def check_broker(url: str, option: str, *, connect_timeout: float = 5.0, wait: float = 10.0,
                 cancel: threading.Event | None = None) -> bool:
    """Log in to the AMQP broker at ``url`` (a kombu URL), retrying for up to ``wait`` seconds
    while it cannot be reached. A refused login or unknown virtual host fails at once.
    Returns False if ``cancel`` was set meanwhile (the process is stopping)."""
    where, user = _describe(url)
    deadline = time.monotonic() + wait
    while True:
        conn = Connection(url, connect_timeout=connect_timeout)
        try:
            conn.ensure_connection(max_retries=0)
            return True
        except amqp.exceptions.AccessRefused as exc:
            raise OperatorError(f"{option}: the broker at {where} refused the login of user "
                                f"{user!r}; check the user and password in the URL") from exc
        except amqp.exceptions.NotAllowed as exc:
            raise OperatorError(f"{option}: the broker at {where} does not let user {user!r} use this "
                                f"virtual host ({exc.reply_text}); check the URL's path "
                                "('//' is the vhost '/')") from exc
        except Exception as exc:  # noqa: BLE001 -- unreachable, for any reason: retry, then say so
            reason = str(exc) or type(exc).__name__
            if time.monotonic() >= deadline:
                raise OperatorError(f"{option}: cannot reach the broker at {where} ({reason}) for "
                                    f"{wait:g} s; start RabbitMQ or fix the host and port in the URL",
                                    EX_UNAVAILABLE) from exc
        finally:
            try:
                conn.collect()
            except Exception:  # noqa: BLE001
                pass
        if cancel is not None and cancel.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            return False
        if cancel is None:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def check_brokers(conf: cfg.ConfigOpts, wait: float, cancel: threading.Event | None = None
                  ) -> bool:
    """Log in to the broker(s) a stream configuration names ([data_plane] stream_url with
    backend = rabbit, the first host of [control_plane] transport_url with backend = oslo);
    False if ``cancel`` was set meanwhile."""
    dp, cp = conf.data_plane, conf.control_plane
    if dp.backend == "rabbit" and dp.stream_url:
        if not check_broker(dp.stream_url, "[data_plane] stream_url",
                            connect_timeout=dp.connect_timeout, wait=wait, cancel=cancel):
            return False
    if cp.backend == "oslo" and cp.transport_url:
        for url in kombu_urls_of(cp.transport_url)[:1]:
            if not check_broker(url, "[control_plane] transport_url",
                                connect_timeout=dp.connect_timeout, wait=wait, cancel=cancel):
                return False
    return True


# -- the one line -----------------------------------------------------------------------------------


def describe_error(exc: BaseException) -> tuple[str, int]:
    """(one line for the operator, exit code) for an exception that ended a command."""
    if isinstance(exc, OperatorError):
        return str(exc), exc.exit_code
    if isinstance(exc, cfg.ConfigFilesNotFoundError):
        files = ", ".join(exc.config_files)
        return f"configuration file not found or not readable: {files}; check --config-file", EX_CONFIG
    if isinstance(exc, cfg.ConfigDirNotFoundError):
        return f"configuration directory not found: {exc.config_dir}; check --config-dir", EX_CONFIG
    if isinstance(exc, cfg.ConfigFileParseError):
        return (f"cannot parse {exc.config_file}: {exc.msg} (sections are [name] lines, options "
                "'name = value' lines, comments lines starting with #)"), EX_CONFIG
    if isinstance(exc, cfg.RequiredOptError):
        group = getattr(exc.group, "name", exc.group) or "DEFAULT"
        return f"[{group}] {exc.opt_name} is required: set it in the configuration file", EX_CONFIG
    if isinstance(exc, cfg.Error):
        return " ".join(str(exc).split()), EX_CONFIG
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}", EX_CONFIG
    return (f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())} "
            "(run with --debug for the traceback)"), EX_SOFTWARE


def report_error(prog: str, exc: BaseException, debug: bool) -> int:
    """Print ``<prog>: error: <what, and what to do>`` on stderr (the traceback first with
    ``debug``); returns the exit code."""
    message, code = describe_error(exc)
    if debug:
        traceback.print_exception(exc)
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return code
