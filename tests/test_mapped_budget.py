"""The pages of a store a process has read are given back past a budget, not after every
batch (`medomni_cas.store._mapped.note`): below it they stay mapped, past it they go, and
reads give the same bytes either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store import _mapped


def _resident(path: Path) -> int:
    """Bytes of the file at ``path`` resident in this process's maps (``Rss`` in smaps)."""
    target, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) == 6 and head[5].strip() == target
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="no /proc/self/smaps")
def test_pages_read_are_kept_below_the_budget_and_given_back_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "store" / "data.mdb"
    with mc.open(f"lmdb://{tmp_path / 'store'}") as store:
        ids = [bytes(store.put_blob(os.urandom(3000))) for _ in range(512)]  # 2 looks
        backend = store.backend
        _mapped.drop(data)
        monkeypatch.setenv("MEDOMNI_MAPPED_BYTES", str(1 << 40))
        want = backend.get_list(ids)
        kept = _resident(data)
        assert kept > 1 << 20, "the pages read are mapped"
        monkeypatch.setenv("MEDOMNI_MAPPED_BYTES", "0")
        monkeypatch.setattr(_mapped, "_base", 0)
        monkeypatch.setattr(_mapped, "_since", 0)
        assert backend.get_list(ids) == want  # past a budget of 0: dropped as it reads
        assert _resident(data) < kept // 2
    assert not _mapped._watched.get(os.path.realpath(data)), "unwatched when closed"
