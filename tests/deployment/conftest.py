"""tests/deployment: a real nova deployment per mode (``nova_deployment.Deployment``).

The tests run with the rest (marked ``deployment``: ``-m "not deployment"`` leaves them
out), in drop-in mode: what an operator deploys. Stock nova on the same harness is the
baseline, run with ``SHM_DEPLOYMENT_MODES=stock,dropin`` (docs/deployment-test.md).
Without MariaDB, RabbitMQ or uWSGI they are skipped with what is missing, unless
``SHM_REQUIRE_DEPLOYMENT=1`` (CI with the services), where they fail. A mode whose own
processes cannot start (the drop-in's console scripts or WSGI module missing) fails.

Sizes: ``SHM_DEPLOYMENT_COMPUTES`` (4), ``SHM_DEPLOYMENT_REPEATS`` (2: repetitions of
the forced-down and disabled checks), ``SHM_DEPLOYMENT_SERVERS`` (6 per repetition),
``SHM_DEPLOYMENT_MODES`` (``dropin``). ``SHM_DEPLOYMENT_FIGURES=FILE`` writes the
figures of the run as JSON; ``SHM_DEPLOYMENT_KEEP=1`` keeps every run directory (the
logs; a failed run's is always kept); ``SHM_DEPLOYMENT_DEBUG=1`` has every service log at
debug level (nova's scheduler then logs the hosts it weighed and claimed);
``SHM_DEPLOYMENT_PLACEMENT_RETRIES`` is placement's ``[placement]
allocation_conflict_retry_count`` (1, as docs/deploy-nova.md says; placement's default is 10).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import nova_deployment as nd  # noqa: E402 - from this directory

MODES = [m.strip() for m in os.environ.get("SHM_DEPLOYMENT_MODES", "dropin").split(",")
         if m.strip()]
COMPUTES = int(os.environ.get("SHM_DEPLOYMENT_COMPUTES", "4"))
FIGURES = nd.FIGURES


def pytest_configure(config: pytest.Config) -> None:
    # openstacksdk warns about its own internals on every call (``_compute_attributes``,
    # ``service_type``): thousands of lines that say nothing about the deployment
    config.addinivalue_line("filterwarnings",
                            "ignore::openstack.warnings.RemovedInSDK50Warning")


@pytest.fixture(scope="module", params=MODES)
def deployment(request: pytest.FixtureRequest) -> Any:
    mode = request.param
    missing = nd.missing_requirements(mode)
    services = [m for m in missing if m.startswith(("MariaDB", "RabbitMQ", "rabbitmqctl"))
                or "uwsgi" in m]
    if services and os.environ.get("SHM_REQUIRE_DEPLOYMENT") != "1":
        pytest.skip("cannot deploy nova here: " + "; ".join(services))
    if missing:
        pytest.fail(f"{mode} mode cannot be deployed: " + "; ".join(missing), pytrace=False)
    started = time.monotonic()
    dep = nd.Deployment(mode, computes=COMPUTES,
                        debug=os.environ.get("SHM_DEPLOYMENT_DEBUG") == "1",
                        placement_retries=int(os.environ.get("SHM_DEPLOYMENT_PLACEMENT_RETRIES",
                                                             "1")))
    dep.start()
    FIGURES.setdefault(mode, {})["start_seconds"] = round(time.monotonic() - started, 1)
    failed_before = request.session.testsfailed
    try:
        yield dep
    finally:
        keep = (os.environ.get("SHM_DEPLOYMENT_KEEP") == "1"
                or request.session.testsfailed > failed_before)
        dep.stop(keep=keep)
        FIGURES[mode]["run_dir" if keep else "run_dir_removed"] = str(dep.dir)
        FIGURES[mode]["module_seconds"] = round(time.monotonic() - started, 1)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("nova deployment figures")
    for mode, figures in FIGURES.items():
        for key, value in figures.items():
            terminalreporter.write_line(f"{mode:7} {key}: {json.dumps(value)}")
    path = os.environ.get("SHM_DEPLOYMENT_FIGURES")
    if path:
        with open(path, "w") as f:
            json.dump(FIGURES, f, indent=2)
