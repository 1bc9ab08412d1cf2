"""Every configuration or state mistake ends `shm reporter` / `shm scheduler` within seconds, with
one line naming the option or file and what to do, and a non-zero exit code (docs/operating.md "Mistakes and
what they print"); a traceback only with --debug; SIGTERM while connecting ends the process.

The processes run for real (subprocesses with config files).  None of these cases reaches a
broker: the URLs point at a port nobody listens on, and every mistake is found before the broker
is needed (the broker cases -- a wrong password -- are in tests/integration/test_operating.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DEAD = _free_port()  # nothing listens here

BASE = f"""[DEFAULT]
broker_start_timeout = 1
[data_plane]
backend = rabbit
stream_url = amqp://guest:guest@127.0.0.1:{DEAD}//
[control_plane]
backend = oslo
transport_url = rabbit://guest:guest@127.0.0.1:{DEAD}/
[metrics]
bind_port = 0
"""


def _unwritable(tmp) -> str:
    if os.geteuid() == 0:  # root writes anywhere on a normal file system
        return "/sys/shm-test-state-dir"
    path = tmp / "readonly"
    path.mkdir()
    path.chmod(0o500)
    return str(path / "state")


def _cases(tmp) -> list[tuple[str, str, str, list[str], int, str]]:
    """(id, command, config text, extra args, exit code, expected text in the one line)."""
    (tmp / "a-file").write_text("")
    corrupt = tmp / "corrupt"
    corrupt.mkdir()
    (corrupt / "epochs.json").write_text("{not json")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    _cases.busy = busy  # type: ignore[attr-defined]  # kept open while the cases run
    return [
        ("inline-comment-in-a-name", "reporter", BASE + "[reporter]\nname = compute-01  # address\n",
         [], 78, "[reporter] name = 'compute-01  # address'"),
        ("inline-comment-in-a-path", "scheduler", BASE + f"[cache]\nstate_dir = {tmp}/s # snapshot\n",
         [], 78, "[cache] state_dir = "),
        ("inline-comment-in-a-bool", "scheduler", BASE + "[signing]\nenabled = false  # true: HMAC\n",
         [], 78, "[signing] enabled: invalid value"),
        ("inline-comment-in-max-age", "reporter", BASE.replace(
            "backend = rabbit\n", "backend = rabbit\nstream_max_age = 1h  # retention\n", 1),
         [], 78, "[data_plane] stream_max_age: invalid value"),
        ("missing-stream-url", "scheduler", BASE.replace(f"stream_url = amqp://guest:guest@127.0.0.1:"
                                                         f"{DEAD}//\n", ""),
         [], 78, "[data_plane] stream_url is required"),
        ("missing-transport-url", "reporter", BASE.replace(f"transport_url = rabbit://guest:guest@"
                                                           f"127.0.0.1:{DEAD}/\n", ""),
         [], 78, "[control_plane] transport_url is required"),
        ("malformed-section", "reporter", BASE + "[reporter\nname = x\n", [], 78, "Invalid section"),
        ("garbage-line", "scheduler", BASE + "this is not an option\n", [], 78,
         "No ':' or '=' found"),
        ("missing-config-file", "reporter", BASE, ["--config-file", str(tmp / "nowhere.conf")], 78,
         "configuration file not found"),
        ("state-dir-under-a-file", "reporter", BASE + f"[reporter]\nstate_dir = {tmp}/a-file/x\n",
         [], 78, "a file is in the way"),
        ("state-dir-unwritable", "scheduler", BASE + f"[cache]\nstate_dir = {_unwritable(tmp)}\n",
         [], 78, "[cache] state_dir = "),
        ("corrupt-epochs-file", "reporter", BASE + f"[reporter]\nstate_dir = {corrupt}\n", [], 78,
         f"the epochs file {corrupt}/epochs.json is unreadable"),
        ("update-log-without-directory", "scheduler", BASE + "[update_log]\nenabled = true\n", [], 78,
         "[update_log] enabled = true needs [update_log] directory"),
        ("unknown-tracker", "reporter", BASE + "[reporter]\ntracker = nowhere.at_all:make\n", [], 78,
         "[reporter] tracker = nowhere.at_all:make: cannot import"),
        ("metrics-port-in-use", "reporter", BASE.replace(
            "bind_port = 0", f"bind_port = {busy.getsockname()[1]}"), [], 78,
         "[metrics] bind_host/bind_port: cannot listen"),
        ("broker-unreachable", "scheduler", BASE, [], 69,
         f"cannot reach the broker at 127.0.0.1:{DEAD}"),
    ]


def _command(cmd: str, conf: str, extra: list[str]) -> list[str]:
    args = extra or ["--config-file", conf]
    return [sys.executable, "-m", "shm_cli.main", cmd, *args]


def _stderr_lines(stderr: str) -> list[str]:
    """What is not a log line (log lines start with the date)."""
    return [line for line in stderr.splitlines() if line.strip() and not line[:2].isdigit()]


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_each_mistake_ends_with_one_line_and_its_exit_code(tmp_path):
    cases = _cases(tmp_path)
    failures = []
    # a few at a time: a dozen Python processes importing at once starve a 2-core machine
    for start in range(0, len(cases), 4):
        procs = []
        for name, cmd, text, extra, code, expected in cases[start:start + 4]:
            conf = tmp_path / f"{name}.conf"
            conf.write_text(text)
            procs.append((name, code, expected, subprocess.Popen(
                _command(cmd, str(conf), extra), cwd=TOP, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)))
        for name, code, expected, proc in procs:
            try:
                _, stderr = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                failures.append(f"{name}: still running after 120 s")
                continue
            lines = _stderr_lines(stderr)
            if proc.returncode != code:
                failures.append(f"{name}: exit code {proc.returncode}, wanted {code}: {stderr[-800:]}")
            elif "Traceback" in stderr:
                failures.append(f"{name}: a traceback: {stderr[-800:]}")
            elif len(lines) != 1 or ": error: " not in lines[0] or expected not in lines[0]:
                failures.append(f"{name}: wanted one line with {expected!r}, got {lines}")
    _cases.busy.close()  # type: ignore[attr-defined]
    assert not failures, "\n".join(failures)


def test_debug_adds_the_traceback(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text(BASE + "[signing]\nenabled = maybe\n")
    result = subprocess.run(_command("reporter", str(conf), []) + ["--debug"], cwd=TOP,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 78
    assert "Traceback" in result.stderr
    assert _stderr_lines(result.stderr)[-1].startswith("shm reporter: error: [signing] enabled")


def _wait_until_it_handles_sigterm(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the process has installed its SIGTERM handler (Linux: SigCgt in /proc), so the
    signal does not land while it still imports, however slow the machine is today."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.05)
    raise AssertionError("the process never installed a SIGTERM handler")


def test_sigterm_while_connecting_ends_the_process_within_seconds(tmp_path):
    """The broker does not answer and the process would wait for it 60 s: SIGTERM ends it."""
    conf = tmp_path / "wait.conf"
    conf.write_text(BASE.replace("broker_start_timeout = 1", "broker_start_timeout = 60"))
    proc = subprocess.Popen(_command("scheduler", str(conf), []), cwd=TOP, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_it_handles_sigterm(proc)
        time.sleep(0.5)  # in the broker check (which waits up to 60 s)
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-800:]
    assert took < 10.0, f"took {took:.1f} s to stop"  # not the 60 s broker wait
    assert "Traceback" not in stderr


@pytest.mark.parametrize("argv,code", [(["--help"], 0), (["nope"], 2)])
def test_status_usage(argv, code):
    result = subprocess.run([sys.executable, "-m", "shm_cli.main", "status", *argv], cwd=TOP,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == code


def test_status_of_an_unreachable_process_says_so():
    result = subprocess.run([sys.executable, "-m", "shm_cli.main", "status", f"127.0.0.1:{DEAD}"],
                            cwd=TOP, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "UNREACHABLE" in result.stdout
