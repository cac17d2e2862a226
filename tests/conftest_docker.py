"""The ``docker_engine`` fixture: a Docker engine for the session (see tests/docker_engine.py).

Without an engine the Docker tests skip, saying how to get one; with MEDOMNI_REQUIRE_DOCKER=1
(set by .ci/run) they fail instead, with dockerd's log tail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import docker_engine as de


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[de.Engine]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        engine = de.acquire(worker)
    except de.EngineUnavailable as e:
        unavailable = e
    else:
        unavailable = None
    if unavailable is not None:
        if de.required():
            msg = (
                f"{de.SKIP_REASON} [{unavailable.detail}]; "
                f"{de.REQUIRE_ENV}=1 makes this a failure instead of a skip"
            )
            if unavailable.log_tail:
                msg += f"\n--- dockerd log (tail) ---\n{unavailable.log_tail}"
            pytest.fail(msg, pytrace=False)
        pytest.skip(f"{de.SKIP_REASON} [{unavailable.detail}]")
    try:
        yield engine
    finally:
        engine.close()
