"""nova-scheduler-shared and nova-compute-shared end like the ``shm`` services on a mistake:
one line on stderr, no traceback, exit 78 (configuration, a refused login) or 69 (the broker
unreachable), and the parent process exits -- oslo.service's process manager does not fork
the scheduler's worker again and again (shared_host_manager/nova/cmd.py, "Errors at start").

The processes run for real (the console scripts, with a nova.conf and a stream configuration);
nova's databases are sqlite files holding nova's schema, so that nova itself would get as far
as forking its scheduler worker.  The cases with a wrong password need the RabbitMQ at
127.0.0.1:5672 (guest/guest); the others reach no broker.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nova.scheduler")  # not just "nova": tests/nova itself is a namespace "nova"

import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

# every test starts nova's console scripts as processes (nova's imports): 2 to 8 s each
pytestmark = [pytest.mark.nova, pytest.mark.slow]

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
RABBIT = ("127.0.0.1", 5672)

#: an exit within this many seconds (nova's imports take a few seconds, more on a busy machine);
#: a worker forked again and again never exits
BOUND = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rabbit_answers() -> bool:
    try:
        with socket.create_connection(RABBIT, timeout=2):
            return True
    except OSError:
        return False


needs_rabbit = pytest.mark.skipif(
    not _rabbit_answers() and os.environ.get("SHM_REQUIRE_RABBITMQ") != "1",
    reason=f"RabbitMQ not reachable at {RABBIT[0]}:{RABBIT[1]}")


@pytest.fixture(scope="module")
def databases(tmp_path_factory):
    """nova's API and main databases (sqlite) with nova's schema: what nova-scheduler reads
    before it forks (cell mappings) and its worker after (its service record)."""
    directory = tmp_path_factory.mktemp("nova-db")
    code = textwrap.dedent(f"""
        import sqlalchemy as sa
        from nova.db.api import models as api_models
        from nova.db.main import models as main_models
        for models, name in ((api_models, "nova_api"), (main_models, "nova")):
            engine = sa.create_engine("sqlite:///{directory}/" + name + ".db")
            @sa.event.listens_for(engine, "connect")
            def fast(dbapi, record):  # a test's throwaway file: no fsync per statement
                dbapi.execute("PRAGMA synchronous = OFF")
            models.BASE.metadata.create_all(engine)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True)
    return directory


def _configs(tmp_path, databases, section: str, stream: str, nova: str = "") -> str:
    """A nova.conf (its own broker guest/guest, placement without keystone) pointing at a stream
    configuration holding ``[section] name`` and ``stream``; returns the nova.conf's path."""
    shm_conf = tmp_path / "shared-host-manager.conf"
    shm_conf.write_text(f"[DEFAULT]\nbroker_start_timeout = 1\n[metrics]\nbind_port = 0\n{stream}"
                        f"[{section}]\nname = {section}-test\n")
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text(textwrap.dedent(f"""\
        [DEFAULT]
        transport_url = rabbit://guest:guest@{RABBIT[0]}:{RABBIT[1]}/
        [database]
        connection = sqlite:///{databases}/nova.db
        [api_database]
        connection = sqlite:///{databases}/nova_api.db
        [placement]
        auth_type = none
        endpoint_override = http://127.0.0.1:{_free_port()}/placement
        [scheduler]
        workers = 1
        [shared_host_manager]
        config_files = {shm_conf}
    """) + nova)
    return str(nova_conf)


def _stream(user_password: str = "guest:guest", port: int = RABBIT[1]) -> str:
    return (f"[data_plane]\nbackend = rabbit\nstream_url = amqp://{user_password}@127.0.0.1:{port}//\n"
            f"[control_plane]\nbackend = oslo\n"
            f"transport_url = rabbit://{user_password}@127.0.0.1:{port}/\n")


def _run(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stderr, stdout: nova's log) of a process that must exit within BOUND
    seconds; the process group (nova's workers too) is killed if it does not."""
    proc = subprocess.Popen(argv, cwd=TOP, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"still running after {BOUND:g} s; stderr ends: {stderr[-1500:]}; "
                    f"stdout ends: {stdout[-1500:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a worker left behind
        except ProcessLookupError:
            pass
    return proc.returncode, stderr, stdout


def _one_line(stderr: str, prog: str) -> str:
    """The one line that is not a log line (log lines start with the date), with no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip() and not line[:2].isdigit()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr[-3000:]
    return lines[0]


def _script(name: str) -> str:
    path = shutil.which(name, path=BIN)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e .)")
    return path


SCHEDULER, COMPUTE = "nova-scheduler-shared", "nova-compute-shared"
CONDUCTOR = "nova-conductor-shared"
WRONG_PASSWORD = "the broker at 127.0.0.1:5672 refused the login of user 'guest'"


@pytest.mark.rabbit
@needs_rabbit
@pytest.mark.parametrize("prog,section", [(SCHEDULER, "cache"), (COMPUTE, "reporter"),
                                          (CONDUCTOR, "reporter")])
def test_a_wrong_broker_password_is_one_line_and_78(prog, section, tmp_path, databases):
    """A login the broker refuses is a configuration mistake, as for ``shm scheduler`` (78: a
    restart would be refused again); nova's own broker, and the database, are never reached."""
    code, stderr, _ = _run([_script(prog), "--config-file",
                            _configs(tmp_path, databases, section, _stream("guest:wrong"))])
    line = _one_line(stderr, prog)
    assert code == 78, stderr[-3000:]
    assert f"[data_plane] stream_url: {WRONG_PASSWORD}" in line


@pytest.mark.parametrize("prog,section", [(SCHEDULER, "cache"), (COMPUTE, "reporter"),
                                          (CONDUCTOR, "reporter")])
def test_an_inline_comment_is_one_line_and_78_without_a_worker(prog, section, tmp_path, databases):
    stream = _stream() + "[signing]\nenabled = false  # true in production\n"
    code, stderr, log = _run([_script(prog), "--config-file",
                              _configs(tmp_path, databases, section, stream)])
    line = _one_line(stderr, prog)
    assert code == 78, stderr[-3000:]
    assert "[signing] enabled: invalid value" in line and "comments must be on a line" in line
    assert "Child" not in log + stderr and "Starting" not in log + stderr  # nothing forked


def test_an_unreachable_broker_is_one_line_and_69(tmp_path, databases):
    dead = _free_port()
    code, stderr, _ = _run([_script(SCHEDULER), "--config-file",
                            _configs(tmp_path, databases, "cache", _stream(port=dead))])
    line = _one_line(stderr, SCHEDULER)
    assert code == 69, stderr[-3000:]
    assert f"[data_plane] stream_url: cannot reach the broker at 127.0.0.1:{dead}" in line


def test_a_mistake_in_nova_conf_own_group_is_one_line_and_78(tmp_path, databases):
    nova_conf = _configs(tmp_path, databases, "cache", _stream(port=_free_port()),
                         "gc_young_threshold = 100000  # fewer full collections\n")
    code, stderr, _ = _run([_script(SCHEDULER), "--config-file", nova_conf])
    line = _one_line(stderr, SCHEDULER)
    assert code == 78, stderr[-3000:]
    assert "[shared_host_manager] gc_young_threshold: invalid value" in line


def test_a_worker_s_mistake_ends_the_parent_with_its_code(tmp_path, databases):
    """A mistake only a forked worker meets (here: its cache service refuses to start) ends
    that worker with 78, and the parent with it: the process manager forks no second worker."""
    nova_conf = _configs(tmp_path, databases, "cache",
                         "[data_plane]\nbackend = inprocess\n[control_plane]\nbackend = inprocess\n")
    code_text = textwrap.dedent(f"""
        import sys
        sys.argv = [{SCHEDULER!r}, "--config-file", {nova_conf!r}]
        from shared_host_manager import service
        from shared_host_manager.nova import cmd
        from transport.startup import OperatorError

        def start(self):
            raise OperatorError("[cache] state_dir = /var/lib/x: not writable (in the worker)")

        service.SchedulerService.start = start
        cmd.main()
    """)
    code, stderr, log = _run([sys.executable, "-c", code_text])
    line = _one_line(stderr, SCHEDULER)
    assert code == 78, stderr[-3000:]
    assert "not writable (in the worker)" in line
    assert (log + stderr).count("Starting scheduler node") == 1, log[-3000:]  # one worker
