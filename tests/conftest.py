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


_SHARED_SCOPES = {"module", "package"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests that share a module fixture on one xdist worker (``--dist loadgroup``):
    under plain ``load`` both workers would build the same Docker job, LLM trials or world."""
    if not config.pluginmanager.hasplugin("xdist"):
        return  # its marker is registered by xdist, and `-p no:xdist` runs everything here
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        defs = info.name2fixturedefs.values()
        if any(d[-1].scope in _SHARED_SCOPES for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else ""))
