"""Shared fixtures: a store of every built-in backend, on temporary paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
