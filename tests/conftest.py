"""Shared fixtures: a store of every built-in backend, on temporary paths."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Nothing in a test reaches beyond this machine: LiteLLM (imported by Harbor, whichever test
# module imports it first) would otherwise try to download its cost map on import, with
# retries and waits, and Harbor would send telemetry.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HARBOR_TELEMETRY", "0")

import medomni_cas as mc

pytest_plugins = ["tests.conftest_docker", "tests.llm_fixtures"]

BACKENDS = ["memory", "lmdb", "file"]


def store_url(kind: str, tmp: Path) -> str:
    return {"memory": "memory://", "lmdb": f"lmdb://{tmp}/lmdb", "file": f"file://{tmp}/dir"}[kind]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[mc.Store]:
    s = mc.open(store_url(request.param, tmp_path))
    yield s
    s.close()

