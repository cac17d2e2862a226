"""The notebook's push and pull: a workspace's remotes by name, or a store by URL."""

from __future__ import annotations

from pathlib import Path

import pytest

import medomni_cas as mc


def _workspace(root: Path, remote: Path) -> Path:
    root.mkdir()
    (root / "workspace.yaml").write_text(
        f"store: lmdb://.medomni/store\nremotes:\n  origin: file://{remote}\n", encoding="utf-8"
    )
    return root


def test_push_and_pull_name_the_workspaces_remote(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    a = _workspace(tmp_path / "a", remote)
    b = _workspace(tmp_path / "b", remote)
    with mc.open_workspace(a) as ws:
        blob = ws.store.put_blob(b"shared")
        ws.store.refs.add_if_new("notes/latest", blob)
        sent = ws.push()
        assert sent.ok and sent.objects >= 1
        # opening the same workspace again while it is open shares its database
        with mc.open_workspace(a) as again:
            assert again.store.refs.get("notes/latest") == blob
    with mc.open_workspace(b) as ws:
        assert ws.store.refs.get("notes/latest") is None
        ws.pull()
        assert ws.store.refs.get("notes/latest") == blob
        assert ws.store.read_blob(blob) == b"shared"


def test_a_store_opened_by_url_needs_a_url_or_store_to_push_to(tmp_path: Path) -> None:
    with mc.open_workspace("memory://") as ws:
        ws.store.refs.add_if_new("notes/latest", ws.store.put_blob(b"x"))
        with pytest.raises(ValueError, match="no workspace to name remote 'origin'"):
            ws.push()
        ws.push(f"file://{tmp_path / 'r'}")
    with mc.open(f"file://{tmp_path / 'r'}") as r:
        assert r.refs.get("notes/latest") is not None
