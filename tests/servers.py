"""The database servers some tests use for real (MariaDB, PostgreSQL on 127.0.0.1).

Without one, such a test is skipped with the reason; with ``SHM_REQUIRE_DATABASES=1`` (set
by ``.ci/run``, whose machine runs both) it fails instead, so a missing server never passes
as a skip.
"""

from __future__ import annotations

import os

import pytest


def database_unavailable(reason: str) -> None:
    """Skip (or, with SHM_REQUIRE_DATABASES=1, fail) the test: ``reason`` says which server."""
    if os.environ.get("SHM_REQUIRE_DATABASES") == "1":
        pytest.fail(reason + " (SHM_REQUIRE_DATABASES=1)", pytrace=False)
    pytest.skip(reason)
