"""A workspace: a folder whose ``workspace.yaml`` names the store and the folders around it.

::

    store: lmdb://.medomni/store     # any store URL; relative lmdb/file paths are relative here
    studio: studio                   # studio/datasets/<dataset>/...
    bench: bench                     # bench/benchmarks/<benchmark>/..., bench/agents/...
    runs: runs                       # run folders (views of run records)

Every key is optional; a folder without the file is a workspace with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medomni_cas.store.url import WORKSPACE_FILE, read_workspace, workspace_store_url

__all__ = ["Workspace", "load_workspace"]

_KEYS = ("store", "studio", "bench", "runs", "remotes")


@dataclass(frozen=True)
class Workspace:
    root: Path
    store_url: str
    studio: Path
    bench: Path
    runs: Path


def _read(root: Path) -> tuple[Path, dict[str, Any]]:
    found = read_workspace(root)
    if found is None:
        return root / WORKSPACE_FILE, {}
    path, data = found
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown setting {unknown[0]!r} (known: {', '.join(_KEYS)})")
    for key in ("studio", "bench", "runs"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{path}: field {key!r} must be a folder path")
    return path, data


def load_workspace(start: str | Path = ".") -> Workspace:
    """The workspace in ``start`` (its ``workspace.yaml`` if there is one)."""
    root = Path(start).resolve()
    path, data = _read(root)

    def folder(key: str) -> Path:
        return (root / data.get(key, key)).resolve()

    return Workspace(
        root=root,
        store_url=workspace_store_url(path, data),
        studio=folder("studio"),
        bench=folder("bench"),
        runs=folder("runs"),
    )
