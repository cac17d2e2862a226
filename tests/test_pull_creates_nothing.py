"""A pull from a remote that is not there creates no local store either."""

from __future__ import annotations

from pathlib import Path

import pytest

from medomni_cas.cli.main import main


@pytest.mark.parametrize("scheme", ["lmdb", "file"])
def test_a_pull_from_no_store_leaves_no_local_store(
    tmp_path: Path, scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    code = main(["--store", f"{scheme}://{mine}", "cas", "pull", f"file://{tmp_path}/typo"])
    assert code == 2
    assert "no store at" in capsys.readouterr().err
    assert not mine.exists()  # the pull was refused before anything was made
