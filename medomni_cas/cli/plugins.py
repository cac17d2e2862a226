"""``medomni plugins``: what installed plug-ins add, group by group, and where from.

Only names and one-line descriptions are read; a plug-in's code is imported when an arm's
description or a benchmark's card is asked for, as the registries themselves do.
"""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from medomni_cas.cli._output import EXIT_OK, add_command, emit
from medomni_cas.studio.arms import ARM_BUILDS_GROUP, ARMS_GROUP, BUILTIN, arm_descriptions
from medomni_cas.studio.benchmarks import BENCHMARKS_GROUP, find_benchmarks, read_card
from medomni_cas.workspace import load_workspace

__all__ = ["register"]

#: Groups listed by name and source only (their objects are not loaded).
OTHER_GROUPS = {
    "medomni.runners": "runners",
    "medomni.labels": "label functions",
    "medomni.backends": "store backends",
}


def _source(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else ep.module


def collect() -> dict[str, list[dict[str, Any]]]:
    """Every plug-in entry, built-ins marked ``medomni-cas`` (they register the same way)."""
    descriptions = arm_descriptions()
    arms = [
        {"name": ep.name, "description": descriptions.get(ep.name, ""), "source": _source(ep)}
        for ep in entry_points(group=ARMS_GROUP)
    ]
    builds = [
        {"name": ep.name, "source": _source(ep)} for ep in entry_points(group=ARM_BUILDS_GROUP)
    ]
    # not installed (run from a source tree): the built-ins are still there
    listed = {a["name"] for a in arms}
    arms += [
        {"name": n, "description": a.description, "source": "medomni-cas"}
        for n, a in BUILTIN.items()
        if n not in listed
    ]
    benchmarks = []
    ws = load_workspace(".")
    for name, src in sorted(find_benchmarks(ws.bench).items()):
        card = read_card(src.path)
        benchmarks.append(
            {
                "name": name,
                "version": card.version,
                "owner": card.owner,
                "path": str(src.path),
                "source": src.source,
            }
        )
    out: dict[str, list[dict[str, Any]]] = {
        "arms": arms,
        "arm builds": builds,
        "benchmarks": benchmarks,
    }
    for group, title in OTHER_GROUPS.items():
        out[title] = [
            {"name": ep.name, "value": ep.value, "source": _source(ep)}
            for ep in sorted(entry_points(group=group), key=lambda e: e.name)
        ]
    return out


def cmd_plugins(args: argparse.Namespace) -> int:
    """List arms, arm builds, benchmarks, runners, label functions and backends."""
    data = collect()
    lines: list[str] = []
    for title, rows in data.items():
        lines.append(f"{title}:")
        if not rows:
            lines.append("  (none)")
        for r in rows:
            extra = r.get("description") or r.get("path") or r.get("value") or ""
            lines.append(f"  {r['name']:<32} {r['source']:<24} {extra}")
    emit(args, data, lines)
    return EXIT_OK


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(groups, "plugins", cmd_plugins, f"list what plug-ins add ({BENCHMARKS_GROUP}, …)")
