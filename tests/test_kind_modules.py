"""Every record kind the package defines is found by a store's check whatever was imported."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from importlib.metadata import entry_points

import medomni_cas
from medomni_cas.store import encoding


def _defined() -> dict[str, list[int]]:
    """Each kind a module of the package registers, with its versions."""
    for info in pkgutil.walk_packages(medomni_cas.__path__, "medomni_cas."):
        importlib.import_module(info.name)
    out: dict[str, list[int]] = {}
    for kind, versions in encoding._REGISTRY.items():
        for version, cls in versions.items():
            if cls.__module__.startswith("medomni_cas."):
                out.setdefault(kind, []).append(version)
    return out


def test_each_kind_is_named_in_the_entry_points() -> None:
    named = {ep.name: ep.value for ep in entry_points(group=encoding.KINDS_GROUP)}
    defined = _defined()
    assert defined, "no record kind found in the package"
    missing = sorted(set(defined) - set(named))
    assert not missing, f"kinds without a {encoding.KINDS_GROUP} entry point: {missing}"
    stray = sorted(set(named) - set(defined))
    assert not stray, f"entry points naming no kind: {stray}"


def test_a_fresh_process_finds_each_kind_by_its_class() -> None:
    """Nothing imported but the store's encoding: each kind's class is still found (so that
    `medomni cas fsck` and `mc.fsck` read a benchmark's records by the fast path)."""
    defined = _defined()
    code = (
        "import json, sys\n"
        "from medomni_cas.store import encoding\n"
        "want = json.loads(sys.argv[1])\n"
        "lost = [f'{k} v{v}' for k, vs in want.items() for v in vs\n"
        "        if encoding.record_class(k, v) is None]\n"
        "assert encoding.record_class('medomni.no-such-kind', 1) is None\n"
        "print(json.dumps(lost))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(defined)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == []
