"""A real multi-process nova 34 deployment on MariaDB and RabbitMQ, for the deployment tests.

:class:`Deployment` starts, each as a process of its own: placement and nova-api
under uWSGI, nova-conductor, one scheduler and N computes with nova's
``fake.FakeDriverWithoutFakeNodes`` (one ``host`` each), plus a small WSGI process
standing in for glance and neutron (``deployment_fakes.py``). There is no keystone: placement runs
with ``[api] auth_strategy = noauth2``, nova-api with a paste pipeline whose
``noauth`` filter takes ``X-Auth-Token: user:project`` as the identity
(``deployment_fakes.NoAuth``). Every run has fresh databases (``<prefix>_nova_api``,
``_nova_cell0``, ``_nova_cell1``, ``_placement``, made by ``nova-manage`` and
``placement-manage``) and a fresh RabbitMQ virtual host, both removed by
:meth:`Deployment.stop`.

Two modes:

* ``stock``: ``nova-scheduler``, ``nova-compute``, ``nova-conductor`` and
  ``nova.wsgi.osapi_compute:application``.
* ``dropin``: ``nova-scheduler-shared``, ``nova-compute-shared``,
  ``nova-conductor-shared`` and ``shared_host_manager.nova.wsgi.osapi_compute:application``,
  with ``[shared_host_manager] config_files`` pointing at one file of the project's
  own options per process (the stream on the run's virtual host, a ``[metrics]``
  endpoint each: :meth:`Deployment.verify` runs ``shm status --verify`` on them).

The client side drives the deployment as an operator's tooling does: an openstacksdk
:class:`~openstack.connection.Connection` (:attr:`Deployment.conn`) on a keystoneauth
session with the ``admin_token`` plugin (every request carries ``X-Auth-Token:
admin:admin``, which nova-api's ``noauth`` filter and placement's ``noauth2`` take as the
caller; no catalog: the compute and placement endpoints are given), and the helpers built
on its compute and placement proxies return the SDK's resources (``Server``,
``Service``, ``ResourceProvider``...).

``python nova_deployment.py [--mode stock|dropin] [--computes N]`` starts one and
keeps it running until interrupted (its endpoints and run directory are printed).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import openstack.connection
from keystoneauth1 import exceptions as ksa_exceptions
from keystoneauth1 import session as ksa_session
from keystoneauth1 import token_endpoint
from openstack import exceptions as sdk_exceptions
from openstack.compute.v2.migration import Migration
from openstack.compute.v2.server import Server
from openstack.compute.v2.service import Service
from openstack.placement.v1.resource_provider import ResourceProvider

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BIN = Path(sys.executable).parent

MYSQL = dict(host="127.0.0.1", port=3306, user="root", password="")
RABBIT = dict(host="127.0.0.1", port=5672, user="guest", password="guest")

MODES = {
    "stock": dict(scheduler="nova-scheduler", compute="nova-compute",
                  conductor="nova-conductor", api="nova.wsgi.osapi_compute:application"),
    "dropin": dict(scheduler="nova-scheduler-shared", compute="nova-compute-shared",
                   conductor="nova-conductor-shared",
                   api="shared_host_manager.nova.wsgi.osapi_compute:application"),
}

# what the deployment tests measured, per mode (tests/deployment/conftest.py prints it)
FIGURES: dict[str, dict[str, Any]] = {}

# the connection's default microversions: compute 2.53 (PUT /os-services/{uuid} with
# forced_down / status; networks "none" from 2.37), placement 1.39
COMPUTE_MICROVERSION = "2.53"
PLACEMENT_MICROVERSION = "1.39"
# every service reports every REPORT_INTERVAL seconds; one whose last report is older than
# SERVICE_DOWN_TIME is down (nova's API, the scheduler's ComputeFilter)
REPORT_INTERVAL = 2
SERVICE_DOWN_TIME = 20
#: how often a compute publishes a heartbeat on the stream ([reporter] heartbeat_interval)
STREAM_HEARTBEAT = 10.0
#: a compute's RPC reply timeout (nova's: 60 s), below SERVICE_DOWN_TIME: see the computes' config
COMPUTE_RPC_TIMEOUT = 15
FLAVORS = {"shm.tiny": dict(ram=64, vcpus=1, disk=1),  # every server boots with it
           "shm.small": dict(ram=128, vcpus=2, disk=2)}  # the resize check's
ADMIN_TOKEN = "admin:admin"
#: the scheduler processes: the first runs always, the second while a check needs two
SCHEDULERS = ("scheduler", "scheduler-2")


class DeploymentError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    """A plain GET without proxies (health probes, /metrics): status and text."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def connect(api_url: str, placement_url: str) -> openstack.connection.Connection:
    """An openstacksdk connection to nova-api at ``api_url`` and placement at
    ``placement_url`` without keystone.

    keystoneauth's ``admin_token`` plugin (as nova's own services reach placement here)
    sends ``X-Auth-Token: admin:admin`` with every request: nova-api's ``noauth`` filter
    and placement's ``noauth2`` take it as the admin. No catalog: the endpoints are
    overridden; the default microversions are COMPUTE_MICROVERSION and
    PLACEMENT_MICROVERSION (the server's range is discovered once, on first use).
    """
    session = ksa_session.Session(auth=token_endpoint.Token(endpoint=None, token=ADMIN_TOKEN),
                                  timeout=60)
    return openstack.connection.Connection(
        session=session, region_name="RegionOne",
        compute_endpoint_override=f"{api_url}/v2.1", compute_api_version=COMPUTE_MICROVERSION,
        placement_endpoint_override=placement_url,
        placement_api_version=PLACEMENT_MICROVERSION)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (sdk_exceptions.SDKException, ksa_exceptions.ClientException, OSError,
                DeploymentError) as exc:
            last_exc, value = exc, None
        if value:
            return value
        time.sleep(interval)
    raise DeploymentError(f"timed out after {timeout:.0f}s waiting for {what}"
                          + (f" (last error: {last_exc})" if last_exc else ""))


def missing_requirements(mode: str) -> list[str]:
    """What this machine lacks to run a deployment in ``mode`` (empty: nothing)."""
    missing = []
    try:
        with socket.create_connection((MYSQL["host"], MYSQL["port"]), timeout=2):
            pass
    except OSError as exc:
        missing.append(f"MariaDB at {MYSQL['host']}:{MYSQL['port']} ({exc})")
    try:
        with socket.create_connection((RABBIT["host"], RABBIT["port"]), timeout=2):
            pass
    except OSError as exc:
        missing.append(f"RabbitMQ at {RABBIT['host']}:{RABBIT['port']} ({exc})")
    if not shutil.which("rabbitmqctl"):
        missing.append("rabbitmqctl (a fresh virtual host per run)")
    for tool in ("uwsgi", "nova-manage", "placement-manage"):
        if not (BIN / tool).exists():
            missing.append(f"{BIN / tool} (pip install -e '.[deploy]')")
    names = MODES[mode]
    for script in (names["scheduler"], names["compute"], names["conductor"]):
        if not (BIN / script).exists():
            missing.append(f"console script {script}")
    module = names["api"].split(":")[0]
    probe = subprocess.run([sys.executable, "-c",
                            f"import importlib.util, sys; "
                            f"sys.exit(importlib.util.find_spec({module!r}) is None)"],
                           capture_output=True)
    if probe.returncode != 0:
        missing.append(f"WSGI module {module}")
    return missing


class Process:
    """One service process: its command, environment and log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path,
                 stop_signal: int = signal.SIGTERM) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.stop_signal = stop_signal
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n==== start {self.starts}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, cwd=self.log.parent)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return
        try:
            os.killpg(popen.pid, self.stop_signal)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        # the group's other processes (uWSGI's workers, oslo.service's children) too:
        # a restart binds the same port
        while True:
            try:
                os.killpg(popen.pid, signal.SIGKILL if time.monotonic() > deadline else 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        popen.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class Deployment:
    """A nova deployment of ``computes`` fake-driver computes in ``mode`` (see the module doc)."""

    def __init__(self, mode: str = "stock", *, computes: int = 4, workdir: str | None = None,
                 api_workers: int = 2, debug: bool = False, placement_retries: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}")
        self.mode = mode
        self.names = MODES[mode]
        self.run_id = uuid.uuid4().hex[:8]
        self.prefix = f"shmdep_{self.run_id}"
        self.vhost = f"shmdep-{self.run_id}"
        self.dir = Path(workdir or tempfile.mkdtemp(prefix=f"shm-deployment-{mode}-"))
        self.hosts = [f"compute-{i}" for i in range(1, computes + 1)]
        self.api_workers = api_workers
        self.conductor_workers = 1
        self.debug = debug
        self.placement_retries = placement_retries
        #: "api" is served by every nova-api worker, "api-<i>" by worker i alone (api())
        self.ports = {name: free_port() for name in (
            "api", *(f"api-{i}" for i in range(1, api_workers + 1)), "placement", "fakes")}
        publishers = [*SCHEDULERS, *self.hosts] + (["placement-feed"] if mode == "dropin" else [])
        self.metrics_ports = {name: free_port() for name in publishers}
        self.processes: dict[str, Process] = {}
        self.cell1_uuid: str | None = None
        self.flavor_ids: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self._conn: openstack.connection.Connection | None = None
        self._worker_conns: dict[int, openstack.connection.Connection] = {}
        self._created_dbs: list[str] = []
        self._vhost_created = False

    # -- endpoints -------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def placement_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['placement']}"

    @property
    def fakes_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['fakes']}"

    def metrics_urls(self) -> list[str]:
        """The endpoints of the publishers that run (a second scheduler only while started)."""
        return [f"http://127.0.0.1:{port}" for name, port in self.metrics_ports.items()
                if name in self.processes]

    def db_url(self, name: str) -> str:
        return (f"mysql+pymysql://{MYSQL['user']}:{MYSQL['password']}@{MYSQL['host']}:"
                f"{MYSQL['port']}/{self.prefix}_{name}?charset=utf8")

    @property
    def transport_url(self) -> str:
        return (f"rabbit://{RABBIT['user']}:{RABBIT['password']}@{RABBIT['host']}:"
                f"{RABBIT['port']}/{self.vhost}")

    @property
    def stream_url(self) -> str:
        return (f"amqp://{RABBIT['user']}:{RABBIT['password']}@{RABBIT['host']}:"
                f"{RABBIT['port']}/{self.vhost}")

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> Deployment:
        t0 = time.monotonic()
        try:
            for sub in ("etc", "logs", "state", "state/api-slots", "lock"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
            self._create_backends()
            self._write_config()
            self._sync_databases()
            self.timings["databases"] = time.monotonic() - t0
            self._start_control()
            self.timings["control"] = time.monotonic() - t0
            self._start_computes()
            self.flavor_ids = {name: self._ensure_flavor(name) for name in FLAVORS}
            self.timings["ready"] = time.monotonic() - t0
        except BaseException:
            self.stop(keep=True)
            raise
        return self

    def stop(self, keep: bool = False) -> None:
        """Stop every process (computes first), drop the databases and the virtual host;
        ``keep`` keeps the run directory (its logs)."""
        computes = [p for n, p in self.processes.items() if n.startswith("compute-")]
        others = [p for n, p in self.processes.items() if not n.startswith("compute-")]
        for group in (computes, others):
            self._parallel([proc.stop for proc in group])
        self._drop_backends()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(keep=exc[0] is not None)

    # -- backends --------------------------------------------------------------------------

    def _mysql(self) -> Any:
        import pymysql

        return pymysql.connect(host=MYSQL["host"], port=MYSQL["port"], user=MYSQL["user"],
                               password=MYSQL["password"], autocommit=True)

    def _create_backends(self) -> None:
        conn = self._mysql()
        try:
            with conn.cursor() as cur:
                for name in ("nova_api", "nova_cell0", "nova_cell1", "placement"):
                    db = f"{self.prefix}_{name}"
                    cur.execute(f"CREATE DATABASE `{db}` CHARACTER SET utf8")
                    self._created_dbs.append(db)
        finally:
            conn.close()
        self._rabbitmqctl("add_vhost", self.vhost)
        self._vhost_created = True
        self._rabbitmqctl("set_permissions", "-p", self.vhost, RABBIT["user"], ".*", ".*", ".*")

    def _drop_backends(self) -> None:
        if self._created_dbs:
            conn = self._mysql()
            try:
                with conn.cursor() as cur:
                    for db in self._created_dbs:
                        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
            finally:
                conn.close()
            self._created_dbs = []
        if self._vhost_created:
            self._rabbitmqctl("delete_vhost", self.vhost, check=False)
            self._vhost_created = False

    @staticmethod
    def _rabbitmqctl(*args: str, check: bool = True) -> None:
        proc = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                              timeout=60)
        if check and proc.returncode != 0:
            raise DeploymentError(f"rabbitmqctl {' '.join(args)}: {proc.stderr.strip()}")

    # -- configuration ---------------------------------------------------------------------

    def _env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "OS_NOVA_DISABLE_EVENTLET_PATCHING": "1",
            "OS_NOVA_CONFIG_DIR": str(self.dir / "etc"),
            "OS_PLACEMENT_CONFIG_DIR": str(self.dir / "etc"),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]
                                          + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
            "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("OS_NOVA_CONFIG_FILES", None)
        env.update(extra)
        return env

    @staticmethod
    def _ini(sections: dict[str, dict[str, Any]]) -> str:
        out = []
        for section, options in sections.items():
            out.append(f"[{section}]")
            out += [f"{key} = {value}" for key, value in options.items() if value is not None]
            out.append("")
        return "\n".join(out)

    def _nova_conf(self, **extra_sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
        token_auth = dict(auth_type="admin_token", endpoint=None, token=ADMIN_TOKEN)
        conf: dict[str, dict[str, Any]] = {
            "DEFAULT": dict(
                transport_url=self.transport_url, state_path=self.dir / "state",
                # FakeDriver's node uuid is new in every process (uuidsentinel), and a
                # compute that ran once refuses to start again without its identity file
                # (nova.virt.node): this one keeps it in the compute's state_path, so that
                # a compute stopped or killed starts again as the same node
                compute_driver="fake.FakeDriverWithoutFakeNodes", my_ip="127.0.0.1",
                debug=self.debug,
                use_stderr=True, graceful_shutdown_timeout=10,
                # servers boot and go away within seconds; nothing periodic in between
                heal_instance_info_cache_interval=-1, instance_build_timeout=0,
                # a stopped or killed compute shows down within seconds, not nova's minute
                # (nova raises a service_down_time not above report_interval to 2.5 times it)
                report_interval=REPORT_INTERVAL, service_down_time=SERVICE_DOWN_TIME,
            ),
            "api": dict(),
            "wsgi": dict(api_paste_config=self.dir / "etc" / "api-paste.ini"),
            "api_database": dict(connection=self.db_url("nova_api")),
            "database": dict(connection=self.db_url("nova_cell1")),
            "placement": dict(token_auth, endpoint=self.placement_url,
                              endpoint_override=self.placement_url, region_name="RegionOne"),
            "glance": dict(endpoint_override=self.fakes_url),
            "neutron": dict(token_auth, endpoint=self.fakes_url, endpoint_override=self.fakes_url,
                            region_name="RegionOne"),
            # the checks keep dozens of servers at once (nova's default: 10 per project)
            "quota": dict(instances=-1, cores=-1, ram=-1, server_groups=-1,
                          server_group_members=-1),
            # tenant isolation on (nova's require_tenant_aggregate request filter): it limits
            # a project only while an aggregate names it (filter_tenant_id), as the tenant
            # check sets and unsets it
            "scheduler": dict(workers=1, discover_hosts_in_cells_interval=-1,
                              limit_tenants_to_placement_aggregate=True),
            "conductor": dict(workers=self.conductor_workers),
            "oslo_concurrency": dict(lock_path=self.dir / "lock"),
            "oslo_messaging_notifications": dict(driver="noop"),
            "notifications": dict(notification_format="unversioned"),
            "vnc": dict(enabled=False),
            "os_vif_ovs": dict(),
        }
        if self.mode == "dropin":
            conf["shared_host_manager"] = dict(default_cell_uuid=self.cell1_uuid,
                                               cell_uuid=self.cell1_uuid,
                                               api_lock_dir=self.dir / "state" / "api-slots")
        for section, options in extra_sections.items():
            conf.setdefault(section, {}).update(options)
        return conf

    def _shm_conf(self, *, cache: str | None = None, reporter: str | None = None,
                  metrics_port: int | None = None) -> str:
        sections: dict[str, dict[str, Any]] = {
            "data_plane": dict(backend="rabbit", stream_url=self.stream_url),
            "control_plane": dict(backend="oslo", transport_url=self.transport_url),
        }
        if cache:
            # a compute silent for SERVICE_DOWN_TIME is down in the drop-in's own view too
            # (/status), as it is for nova's ComputeFilter
            sections["cache"] = dict(name=cache, down_interval=SERVICE_DOWN_TIME,
                                     membership_interval=1)
        if reporter:
            sections["reporter"] = dict(name=reporter)
        # the API-side sources (nova-api's workers, nova-conductor): any free port each, so
        # that workers of one process do not collide; verify() reads the others only
        sections["metrics"] = dict(bind_port=metrics_port if metrics_port is not None else 0)
        return self._ini(sections)

    def _write_config(self) -> None:
        etc = self.dir / "etc"
        (etc / "nova.conf").write_text(self._ini(self._nova_conf()))
        # the cell0 database, synced apart from the cell1 one (db sync --local_cell)
        (etc / "nova-cell0.conf").write_text(self._ini(self._nova_conf(
            database=dict(connection=self.db_url("nova_cell0")))))
        (etc / "placement.conf").write_text(self._ini({
            "DEFAULT": dict(debug=self.debug),
            # as docs/deploy-nova.md says (placement.conf): placement's own default retries a
            # claim that lost a generation race in its transaction, which can overcommit
            "placement": dict(allocation_conflict_retry_count=self.placement_retries),
            "api": dict(auth_strategy="noauth2"),
            "placement_database": dict(connection=self.db_url("placement")),
            "oslo_concurrency": dict(lock_path=self.dir / "lock"),
        }))
        paste = (Path(sys.prefix) / "etc" / "nova" / "api-paste.ini").read_text()
        paste = paste.replace("authtoken keystonecontext", "noauth keystonecontext")
        paste += "\n[filter:noauth]\npaste.filter_factory = deployment_fakes:NoAuth.factory\n"
        (etc / "api-paste.ini").write_text(paste)

    def _write_service_config(self) -> None:
        """The per-process files, once the cell's uuid is known."""
        etc = self.dir / "etc"
        shm = self.mode == "dropin"

        def nova(name: str, shm_text: str | None, **sections: dict[str, Any]) -> None:
            if shm:
                (etc / f"shm-{name}.conf").write_text(shm_text or "")
                sections.setdefault("shared_host_manager", {})["config_files"] = \
                    etc / f"shm-{name}.conf"
            (etc / f"nova-{name}.conf").write_text(self._ini(self._nova_conf(**sections)))

        if shm:
            # the placement feed on placement's database (docs/deploy-nova.md "Placement feed")
            feed = self._shm_conf(metrics_port=self.metrics_ports["placement-feed"])
            feed += self._ini({"placement_feed": dict(connection=self.db_url("placement"))})
            (etc / "shm-placement-feed.conf").write_text(feed)
        nova("api", self._shm_conf(reporter="api"))
        nova("conductor", self._shm_conf(reporter="conductor"))
        for i, name in enumerate(SCHEDULERS, 1):
            # several schedulers as docs/deploy-nova.md recommends: each puts the best host it
            # owns first, and tells its peers what it claims; the second runs on a host of
            # its own (nova's service record) and only while a check starts it
            nova(name, self._shm_conf(cache=f"sched-{i}", metrics_port=self.metrics_ports[name]),
                 DEFAULT=dict(host=name) if i > 1 else {},
                 **({"shared_host_manager": dict(host_ownership=True)} if shm else {}))
        for host in self.hosts:
            state = self.dir / "state" / host
            state.mkdir(parents=True, exist_ok=True)
            nova(host, self._shm_conf(reporter=host, metrics_port=self.metrics_ports[host]),
                 DEFAULT=dict(host=host, state_path=state, instances_path=state / "instances",
                              # a report in flight when the conductor restarts waits this
                              # long for a reply that never comes; with nova's 60 s the
                              # compute shows down meanwhile, and nova-api then skips the
                              # COMPUTE_STATUS_DISABLED sync of an enable (the host stays
                              # out of placement's candidates until the compute restarts)
                              rpc_response_timeout=COMPUTE_RPC_TIMEOUT),
                 # a compute reaches the databases through the conductor only
                 database=dict(connection=None), api_database=dict(connection=None))

    # -- databases -------------------------------------------------------------------------

    def _manage(self, *args: str, conf: str = "nova.conf", tool: str = "nova-manage") -> str:
        argv = [str(BIN / tool), "--config-file", str(self.dir / "etc" / conf), *args]
        proc = subprocess.run(argv, env=self._env(), capture_output=True, text=True, timeout=600)
        with open(self.dir / "logs" / "manage.log", "a") as log:
            log.write(f"==== {' '.join(argv)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            raise DeploymentError(f"{tool} {' '.join(args)} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc.stdout

    def _parallel(self, calls: Iterable[Callable[[], Any]]) -> list[Any]:
        results: list[Any] = []
        errors: list[BaseException] = []

        def run(call: Callable[[], Any]) -> None:
            try:
                results.append(call())
            except BaseException as exc:  # noqa: BLE001 - raised below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(c,)) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def _sync_databases(self) -> None:
        self._parallel([
            lambda: self._manage("api_db", "sync"),
            lambda: self._manage("db", "sync", "--local_cell"),
            lambda: self._manage("db", "sync", "--local_cell", conf="nova-cell0.conf"),
            lambda: self._manage("db", "sync", conf="placement.conf", tool="placement-manage"),
        ])
        self._manage("cell_v2", "map_cell0", "--database_connection", self.db_url("nova_cell0"))
        out = self._manage("cell_v2", "create_cell", "--name", "cell1", "--verbose")
        match = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", out)
        if not match:
            raise DeploymentError(f"nova-manage cell_v2 create_cell printed no uuid: {out!r}")
        self.cell1_uuid = match.group(0)
        self._write_service_config()

    # -- processes -------------------------------------------------------------------------

    def _uwsgi(self, name: str, module: str, port: int, workers: int,
               worker_ports: Iterable[int] = ()) -> Process:
        """uWSGI serving ``module`` on ``port`` with ``workers`` workers, and worker i alone on
        the i-th of ``worker_ports`` (uWSGI's ``map-socket``)."""
        argv = [str(BIN / "uwsgi"), "--master", "--die-on-term", "--need-app",
                "--http-socket", f"127.0.0.1:{port}", "--processes", str(workers),
                "--threads", "1", "--enable-threads", "--virtualenv", sys.prefix,
                # as etc/uwsgi/nova-api-shared.ini: a worker's exit does not wait for the
                # master's threads
                "--py-call-osafterfork",
                "--buffer-size", "65535", "--worker-reload-mercy", "10", "--module", module,
                # uWSGI's http-socket closes every connection after its answer: say so, or
                # clients that keep connections alive reuse a closed one
                "--add-header", "Connection: close"]
        for worker, worker_port in enumerate(worker_ports, 1):
            argv += ["--http-socket", f"127.0.0.1:{worker_port}",
                     "--map-socket", f"{worker}:{worker}"]
        if name == "api" and self.mode == "dropin":
            pass  # as etc/uwsgi/nova-api-shared.ini: the app loads in the master, workers fork
        else:
            argv.append("--lazy-apps")  # as devstack runs nova-api and placement
        env = self._env()
        if name == "api":
            env["OS_NOVA_CONFIG_FILES"] = "api-paste.ini;nova-api.conf"
        return Process(name, argv, env, self.dir / "logs" / f"{name}.log")

    def _service(self, name: str, script: str) -> Process:
        argv = [str(BIN / script), "--config-file", str(self.dir / "etc" / f"nova-{name}.conf")]
        return Process(name, argv, self._env(), self.dir / "logs" / f"{name}.log")

    def _start_control(self) -> None:
        procs = self.processes
        procs["fakes"] = Process("fakes", [sys.executable, str(HERE / "deployment_fakes.py"),
                                           str(self.ports["fakes"])],
                                 self._env(), self.dir / "logs" / "fakes.log")
        procs["placement"] = self._uwsgi("placement", "placement.wsgi.api:application",
                                         self.ports["placement"], 2)
        procs["api"] = self._uwsgi("api", self.names["api"], self.ports["api"], self.api_workers,
                                   [self.ports[f"api-{i}"] for i in range(1, self.api_workers + 1)])
        procs["conductor"] = self._service("conductor", self.names["conductor"])
        procs["scheduler"] = self._service("scheduler", self.names["scheduler"])
        if self.mode == "dropin":
            procs["placement-feed"] = Process(
                "placement-feed", [str(BIN / "shm"), "placement-feed", "--config-file",
                                   str(self.dir / "etc" / "shm-placement-feed.conf")],
                self._env(), self.dir / "logs" / "placement-feed.log")
        for proc in procs.values():
            proc.start()
        self._wait_http("fakes", self.fakes_url + "/v2/images")
        self._wait_http("placement", self.placement_url + "/")
        self.wait_api()
        self.wait_service("nova-conductor", "conductor")
        self.wait_service("nova-scheduler", "scheduler")

    def _start_computes(self) -> None:
        for host in self.hosts:
            self.processes[host] = self._service(host, self.names["compute"])
            self.processes[host].start()
        for host in self.hosts:
            self.wait_service("nova-compute", host, timeout=180)
        wait_until(lambda: len(self.resource_providers()) >= len(self.hosts), 120,
                   "every compute's resource provider")
        self.discover_hosts()
        # the hypervisors API lists the nodes of mapped hosts only
        wait_until(lambda: len(list(self.conn.compute.hypervisors())) >= len(self.hosts), 60,
                   "every compute's hypervisor")
        if self.mode == "dropin":
            self.verify(timeout=60)

    def _check_alive(self, *names: str) -> None:
        for name in names:
            proc = self.processes[name]
            if not proc.alive():
                raise DeploymentError(f"{name} exited ({proc.popen and proc.popen.returncode});"
                                      f" its log {proc.log}:\n{proc.tail()}")

    def _wait_http(self, name: str, url: str, timeout: float = 120) -> None:
        """Until the process ``name`` answers ``url`` (a plain HTTP probe of its port)."""
        def ok() -> bool:
            self._check_alive(name)
            return http_get(url, timeout=5)[0] < 500
        wait_until(ok, timeout, f"{name} at {url}")

    def wait_api(self, timeout: float = 180) -> None:
        """Until nova-api answers its version document (a plain probe: the connection's
        first use discovers the microversions from it) and lists the services."""
        def ok() -> bool:
            self._check_alive("api")
            if http_get(self.api_url + "/v2.1/", timeout=5)[0] != 200:
                return False
            self.services("nova-conductor")
            return True
        wait_until(ok, timeout, "nova-api")

    def wait_service(self, binary: str, name: str, timeout: float = 120) -> Service:
        host = name if name.startswith("compute-") else None

        def up() -> Service | None:
            self._check_alive(name)
            for svc in self.services(binary):
                if (host is None or svc.host == host) and svc.state == "up":
                    return svc
            return None
        return wait_until(up, timeout, f"{binary} {name} up")

    def wait_reported_since(self, since: datetime.datetime, timeout: float = 120) -> None:
        """Every compute has reported (its service's ``updated_at``) after ``since`` (naive
        UTC, as nova stores it): after a conductor restart, through the new conductor."""
        def reported() -> bool:
            fresh = {svc.host for svc in self.services()
                     if svc.updated_at and svc.state == "up"
                     and datetime.datetime.fromisoformat(svc.updated_at).replace(tzinfo=None) > since}
            return set(self.hosts) <= fresh
        wait_until(reported, timeout, f"every compute reporting after {since.isoformat()}")

    def start_scheduler(self, name: str = SCHEDULERS[1]) -> None:
        """Start a further scheduler process (one of SCHEDULERS) and wait until it serves;
        ``stop_scheduler`` stops it again (its service record stays, down)."""
        if name not in self.processes:
            self.processes[name] = self._service(name, self.names["scheduler"])
            self.processes[name].log.touch()
        self.restart(name)

    def stop_scheduler(self, name: str = SCHEDULERS[1]) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def restart(self, *names: str) -> None:
        """Restart processes by name (``api``, ``conductor``, ``scheduler``, ``compute-N``)
        and wait until they serve again."""
        procs = [self.processes[name] for name in names]
        self._parallel([proc.stop for proc in procs])
        markers = {proc.name: proc.log.stat().st_size for proc in procs}
        for proc in procs:
            proc.start()
        for proc in procs:
            name = proc.name
            if name == "api":
                self.wait_api()
            elif name == "placement":
                self._wait_http(name, self.placement_url + "/")
            else:
                # nova's Service logs this once its RPC server is about to start
                def started(proc: Process = proc) -> bool:
                    self._check_alive(proc.name)
                    log = proc.log.read_bytes()[markers[proc.name]:]
                    return b"Starting " in log
                wait_until(started, 120, f"{name} started")
                if self.mode == "dropin" and name in self.metrics_ports:
                    # the drop-in's own endpoint: its cache is restored and its stream read
                    self._wait_http(name, f"http://127.0.0.1:{self.metrics_ports[name]}/metrics")

    # -- client ----------------------------------------------------------------------------

    @property
    def conn(self) -> openstack.connection.Connection:
        """The openstacksdk connection to this deployment (made on first use)."""
        if self._conn is None:
            self._conn = connect(self.api_url, self.placement_url)
        return self._conn

    def api(self, worker: int | None = None) -> openstack.connection.Connection:
        """The connection whose compute calls nova-api's worker ``worker`` (1, 2, ...) takes
        alone; None: :attr:`conn`, any worker."""
        if worker is None:
            return self.conn
        if worker not in self._worker_conns:
            self._worker_conns[worker] = connect(
                f"http://127.0.0.1:{self.ports[f'api-{worker}']}", self.placement_url)
        return self._worker_conns[worker]

    # -- what the tests do -----------------------------------------------------------------

    def _ensure_flavor(self, name: str = "shm.tiny") -> str:
        for flavor in self.conn.compute.flavors():
            if flavor.name == name:
                return str(flavor.id)
        return self.create_flavor(name, **FLAVORS[name])

    def create_flavor(self, name: str, ram: int, vcpus: int = 1, disk: int = 1) -> str:
        """``openstack flavor create``: a flavor ``boot`` and ``resize`` then take by name."""
        flavor_id = str(self.conn.compute.create_flavor(name=name, ram=ram, vcpus=vcpus,
                                                        disk=disk).id)
        self.flavor_ids[name] = flavor_id
        return flavor_id

    def delete_flavor(self, name: str) -> None:
        self.conn.compute.delete_flavor(self.flavor_ids.pop(name), ignore_missing=True)

    def inventories(self, rp: ResourceProvider) -> dict[str, dict[str, Any]]:
        """Placement's inventories of ``rp``: resource class -> total, reserved,
        allocation_ratio, min_unit, max_unit, step_size."""
        inventories: dict[str, dict[str, Any]] = \
            self.conn.placement.get(f"/resource_providers/{rp.id}/inventories").json()[
                "inventories"]
        return inventories

    def flavor_resources(self, name: str) -> dict[str, int]:
        """What a server of flavor ``name`` holds in placement."""
        f = self.conn.compute.get_flavor(self.flavor_ids[name])
        return {"VCPU": f.vcpus, "MEMORY_MB": f.ram, "DISK_GB": f.disk}

    def services(self, binary: str = "nova-compute") -> list[Service]:
        return list(self.conn.compute.services(binary=binary))

    def service(self, host: str) -> Service:
        """The nova-compute service on ``host``."""
        for svc in self.services():
            if svc.host == host:
                return svc
        raise DeploymentError(f"no nova-compute service on {host}")

    def service_id(self, host: str) -> str:
        return str(self.service(host).id)

    def delete_service(self, host: str) -> None:
        """``openstack compute service delete``: nova deletes the service, its compute node,
        the node's resource provider and the host mapping."""
        self.conn.compute.delete_service(self.service_id(host))

    def discover_hosts(self) -> None:
        """``nova-manage cell_v2 discover_hosts``: maps computes that have no host mapping."""
        self._manage("cell_v2", "discover_hosts", "--verbose")

    def force_down(self, host: str, down: bool = True, worker: int | None = None) -> None:
        """``openstack compute service set [--down|--up]``, through nova-api's ``worker``."""
        self.api(worker).compute.update_service_forced_down(self.service(host), forced=down)

    def disable(self, host: str, disabled: bool = True, worker: int | None = None) -> None:
        """``openstack compute service set [--disable|--enable]``, through ``worker``."""
        if disabled:
            self.api(worker).compute.disable_service(self.service(host),
                                                     disabled_reason="deployment test")
        else:
            self.api(worker).compute.enable_service(self.service(host))

    def create_group(self, name: str, policy: str = "anti-affinity") -> str:
        return str(self.conn.compute.create_server_group(name=name, policies=[policy]).id)

    def delete_group(self, group: str) -> None:
        self.conn.compute.delete_server_group(group, ignore_missing=False)

    def create_aggregate(self, name: str, zone: str | None = None) -> str:
        """``openstack aggregate create [--zone ZONE] NAME``; its id."""
        return str(self.conn.compute.create_aggregate(name=name, availability_zone=zone).id)

    def aggregate_add_host(self, aggregate: str, host: str) -> None:
        self.conn.compute.add_host_to_aggregate(aggregate, host)

    def aggregate_remove_host(self, aggregate: str, host: str) -> None:
        self.conn.compute.remove_host_from_aggregate(aggregate, host)

    def set_aggregate_metadata(self, aggregate: str, metadata: dict[str, str | None],
                               worker: int | None = None) -> None:
        """``openstack aggregate set --property K=V`` (``unset`` for a None value), through
        nova-api's ``worker``."""
        self.api(worker).compute.set_aggregate_metadata(aggregate, metadata)

    def delete_aggregate(self, aggregate: str) -> None:
        """The aggregate without its hosts, then the aggregate (nova refuses one with hosts)."""
        for host in self.conn.compute.get_aggregate(aggregate).hosts or []:
            self.aggregate_remove_host(aggregate, host)
        self.conn.compute.delete_aggregate(aggregate, ignore_missing=False)

    def boot(self, name: str, count: int = 1, *, group: str | None = None,
             zone: str | None = None, flavor: str = "shm.tiny") -> None:
        """One create request for ``count`` servers named ``name-<i>`` of ``flavor`` (in
        availability zone ``zone`` when given)."""
        attrs: dict[str, Any] = dict(name=name, image_id=_fakes().IMAGE_ID,
                                     flavor_id=self.flavor_ids[flavor], networks="none",
                                     min_count=count, max_count=count)
        if group:
            attrs["scheduler_hints"] = {"group": group}
        if zone:
            attrs["availability_zone"] = zone
        self.conn.compute.create_server(**attrs)

    def boot_at_once(self, names: Iterable[str], flavor: str = "shm.tiny",
                     group: str | None = None) -> None:
        """One create request per name (in server group ``group``), all sent at the same
        time (a thread each)."""
        self._parallel([functools.partial(self.boot, n, flavor=flavor, group=group)
                        for n in names])

    def rebuild(self, sid: str, image: str) -> None:
        """``openstack server rebuild --image IMAGE``: the server on its own compute with
        another image; nova asks the scheduler whether that compute fits the new image."""
        self.conn.compute.rebuild_server(sid, image)

    def server(self, sid: str) -> Server:
        return self.conn.compute.get_server(sid)

    def migrate(self, sid: str) -> None:
        """A cold migration, the scheduler choosing the host."""
        self.conn.compute.migrate_server(sid)

    def resize(self, sid: str, flavor: str) -> None:
        """A resize to flavor ``flavor`` (a name of FLAVORS)."""
        self.conn.compute.resize_server(sid, self.flavor_ids[flavor])

    def confirm_resize(self, sid: str) -> None:
        self.conn.compute.confirm_server_resize(sid)

    def live_migrate(self, sid: str) -> None:
        """A live migration, the scheduler choosing the host (``host: null``,
        ``block_migration: "auto"``)."""
        self.conn.compute.live_migrate_server(sid, host=None, block_migration="auto")

    def evacuate(self, sid: str) -> None:
        """``openstack server evacuate``: the server of a compute that is down rebuilt on
        another, the scheduler choosing it."""
        self.conn.compute.evacuate_server(sid)

    def wait_server(self, sid: str, statuses: Iterable[str] = ("ACTIVE", "VERIFY_RESIZE"),
                    timeout: float = 180) -> Server:
        """The server once no task runs on it and it is in one of ``statuses`` or ERROR
        (a confirmed resize stays VERIFY_RESIZE until the source compute is done)."""
        wanted = {*statuses, "ERROR"}

        def settled() -> Server | None:
            server = self.server(sid)
            if server.task_state is None and server.status in wanted:
                return server
            return None
        return wait_until(settled, timeout, f"server {sid} to settle")

    def migrations(self, sid: str) -> list[Migration]:
        return list(self.conn.compute.migrations(server_id=sid))

    def allocations(self, consumer: str) -> dict[str, dict[str, int]]:
        """Placement's allocations of ``consumer`` per provider name."""
        names = {rp.id: rp.name for rp in self.resource_providers()}
        allocs = self.conn.placement.get_allocation(consumer).allocations or {}
        return {names.get(rp, rp): a["resources"] for rp, a in allocs.items()}

    def wait_service_down(self, host: str, timeout: float = 120) -> Service:
        """The compute on ``host`` once nova's API shows it down (SERVICE_DOWN_TIME)."""
        def down() -> Service | None:
            for svc in self.services():
                if svc.host == host and svc.state == "down":
                    return svc
            return None
        return wait_until(down, timeout, f"nova-compute {host} down")

    def kill(self, name: str) -> None:
        """SIGKILL to the process ``name`` (its process only, as a crash): no clean-up."""
        proc = self.processes[name]
        if proc.popen is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)

    def servers(self, name: str | None = None) -> list[Server]:
        if name:
            return list(self.conn.compute.servers(details=True, name=f"^{name}"))
        return list(self.conn.compute.servers(details=True))

    def wait_servers(self, name: str, count: int, timeout: float = 180) -> list[Server]:
        """The ``count`` servers whose name starts with ``name`` once none is building."""
        last: list[Server] = []

        def settled() -> list[Server] | None:
            last[:] = found = self.servers(name)
            if len(found) == count and all(s.status in ("ACTIVE", "ERROR") for s in found):
                return found
            return None
        try:
            return wait_until(settled, timeout, f"{count} servers {name}* to settle")
        except DeploymentError as exc:
            # where each stands says which service held it: the scheduler (no host yet),
            # the conductor or the compute (a host, still spawning)
            where = "; ".join(f"{s.name} {s.status}/{s.task_state or '-'} on "
                              f"{s.compute_host or 'no host'}" for s in last)
            raise DeploymentError(f"{exc}; found {len(last)}: {where or 'none'}") from None

    def delete_servers(self, servers: list[Server], timeout: float = 180) -> None:
        ids = {s.id for s in servers}
        for sid in ids:
            try:
                self.conn.compute.delete_server(sid, ignore_missing=True)
            except sdk_exceptions.HttpException:
                pass  # one in a state that refuses deletion: the wait below says so
        wait_until(lambda: not ids & {s.id for s in self.servers()}, timeout,
                   f"{len(ids)} servers deleted")

    def resource_providers(self) -> list[ResourceProvider]:
        return list(self.conn.placement.resource_providers())

    def usages(self) -> dict[str, dict[str, int]]:
        """Placement's usages per provider name."""
        return {rp.name: self.conn.placement.fetch_resource_provider_usages(rp).usages
                for rp in self.resource_providers()}

    def scheduler_views(self) -> dict[str, str]:
        """The state of every source the drop-in's scheduler holds (``/status?sources=1``):
        source (a compute node's uuid, for a compute) -> active, down or syncing."""
        _, text = http_get(f"http://127.0.0.1:{self.metrics_ports['scheduler']}/status?sources=1",
                           timeout=10)
        return {source: view[3] for source, view in json.loads(text)["views"].items()}

    def node_of(self, host: str) -> str:
        """The uuid of ``host``'s compute node (its hypervisor's id, microversion 2.53)."""
        for hypervisor in self.conn.compute.hypervisors(details=True):
            if hypervisor.service_details and hypervisor.service_details.get("host") == host:
                return str(hypervisor.id)
        raise DeploymentError(f"no hypervisor of {host}")

    def metrics(self, name: str = SCHEDULERS[0]) -> dict[str, float]:
        """The Prometheus samples of the drop-in process ``name`` (a scheduler by default, the
        placement feed, a compute), ``name{labels}`` -> value."""
        _, text = http_get(f"http://127.0.0.1:{self.metrics_ports[name]}/metrics", timeout=10)
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def goodbyes(self) -> int:
        """Goodbyes the scheduler has applied so far (drop-in mode)."""
        return int(self.metrics().get('shm_receiver_events_total{event="goodbyes"}', 0))

    def verify(self, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``shm status --verify`` on the scheduler's and the computes' endpoints."""
        argv = [str(BIN / "shm"), "status", "--verify", "--timeout", str(timeout),
                *self.metrics_urls()]
        proc = subprocess.run(argv, env=self._env(), capture_output=True, text=True,
                              timeout=timeout + 60)
        if proc.returncode != 0:
            raise DeploymentError(f"shm status --verify -> {proc.returncode}:\n"
                                  f"{proc.stdout}{proc.stderr}")
        return proc

    def log_sizes(self, *names: str) -> dict[str, int]:
        """Where the logs of ``names`` end now: ``log_count``'s ``since``."""
        return {n: self.processes[n].log.stat().st_size for n in names}

    def log_count(self, text: str, since: dict[str, int]) -> int:
        """Lines holding ``text`` in the logs of ``since``'s processes, written after it."""
        count = 0
        for name, offset in since.items():
            with open(self.processes[name].log, "rb") as f:
                f.seek(offset)
                count += sum(text.encode() in line for line in f)
        return count

    def logs(self, *names: str, lines: int = 30) -> str:
        names = names or tuple(self.processes)
        return "\n".join(f"--- {n} ({self.processes[n].log})\n{self.processes[n].tail(lines)}"
                         for n in names if n in self.processes)


def _fakes() -> Any:
    sys.path.insert(0, str(HERE)) if str(HERE) not in sys.path else None
    import deployment_fakes

    return deployment_fakes


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="stock")
    parser.add_argument("--computes", type=int, default=4)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    missing = missing_requirements(args.mode)
    if missing:
        sys.exit("cannot deploy: " + "; ".join(missing))
    dep = Deployment(args.mode, computes=args.computes, debug=args.debug).start()
    print(json.dumps({"mode": dep.mode, "dir": str(dep.dir), "compute_api": dep.api_url + "/v2.1",
                      "placement": dep.placement_url, "metrics": dep.metrics_urls(),
                      "auth": f"X-Auth-Token: {ADMIN_TOKEN}", "timings": dep.timings}, indent=2),
          flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        dep.stop(keep=True)


if __name__ == "__main__":
    main()
