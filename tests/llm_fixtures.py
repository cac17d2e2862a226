"""Fixtures of the LLM agent tests (test_llm_agent, test_routes, test_secrets), shared through
``pytest_plugins`` in tests/conftest.py (a fixture imported into a module trips ruff's F811).

``url``: a fresh LMDB store under the test's tmp folder, with the set ``medomni-bench/small``
built from the module's own ``tree`` fixture (each module picks its cohort's size).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.studio.tasksets import build_set

__all__ = ["SET", "url"]

SET = "medomni-bench/small"


@pytest.fixture
def url(tree: Path, tmp_path: Path) -> Iterator[str]:
    url = f"lmdb://{tmp_path / 'store'}"
    with mc.open(url) as s:
        build_set(s, SET, studio=tree / "studio", bench=tree / "bench")
    yield url
