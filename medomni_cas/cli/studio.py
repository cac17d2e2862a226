"""``medomni studio …``: build tasks and task sets, show, publish and rebuild sets, sign off
templates, commit to a set's answers and reveal them. Folders default to the workspace's
(``workspace.yaml``: ``studio``, ``bench``)."""

from __future__ import annotations

import argparse
from typing import Any

from medomni_cas import porcelain
from medomni_cas.cli._output import (
    EXIT_OK,
    EXIT_PROBLEM,
    add_command,
    common_options,
    emit,
    open_store,
    to_builtins,
    workspace_folders,
)
from medomni_cas.cli._progress import bars
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.build import Built
from medomni_cas.studio.folders import find_template, load_template, nesting_notes
from medomni_cas.studio.schema import SpecError
from medomni_cas.studio.signoff import signoff
from medomni_cas.studio.tasksets import publish, show_set

__all__ = ["register"]


def _built_row(b: Built) -> dict[str, Any]:
    return to_builtins(
        {
            "pair": b.pair,
            "arm": b.arm,
            "arm_variant": b.variant,
            "config_hash": b.config,
            "result": b.result,
            "cached": b.cached,
        }
    )


def _built_line(b: Built) -> str:
    arm = arm_label(b.arm, b.variant)
    state = "unchanged" if b.cached else "built"
    return f"{b.pair:<36} {arm:<28} config {b.config.hex()[:12]}  {b.result.hex()[:12]}  {state}"


# -- verbs ---------------------------------------------------------------------------------------
def cmd_task_build(args: argparse.Namespace) -> int:
    """Build one pair, ``<template>@<cohort>``, outside any task set."""
    folders = workspace_folders()
    porcelain.check_pair(folders.get("studio", args.studio), args.pair)  # before a store is made
    with open_store(args, create=True) as store:
        built = porcelain.build_pair(
            store,
            args.pair,
            folders=folders,
            studio=args.studio,
            arms=args.arm,
            data_root=args.data_root,
            progress=bars(args),
        )
    notes = nesting_notes(folders.get("studio", args.studio), [b.pair for b in built])
    emit(
        args,
        {"builds": [_built_row(x) for x in built], "notes": notes},
        [_built_line(x) for x in built] + [f"note: {n}" for n in notes],
    )
    return EXIT_OK


def cmd_taskset_build(args: argparse.Namespace) -> int:
    """Build every pair of ``<benchmark>/<set>`` under every arm and record the set."""
    folders = workspace_folders()
    studio, bench = folders.get("studio", args.studio), folders.get("bench", args.bench)
    porcelain.check_set(args.name, studio=studio, bench=bench)  # before a store is made
    with open_store(args, create=True) as store:
        built = porcelain.build(
            store,
            args.name,
            folders=folders,
            studio=studio,
            bench=bench,
            data_root=args.data_root,
            shard=args.shard,
            progress=bars(args),
        )
    if built is None:
        emit(
            args,
            {"name": args.name, "shard": list(args.shard)},
            f"built shard {args.shard[0]}/{args.shard[1]} of {args.name}; build it once "
            "without --shard to record the set",
        )
        return EXIT_OK
    data = {
        "name": built.name,
        "task_set": built.task_set,
        "build": built.build,
        "builds": [_built_row(x) for x in built.builds],
        "frozen": [
            {"pair": f.task, "n": f.pinned, "version": str(f.version)} for f in built.frozen
        ],
        "notes": nesting_notes(studio, [b.pair for b in built.builds]),
    }
    lines = [_built_line(x) for x in built.builds]
    lines += [
        f"{f.task:<36} frozen at N={f.pinned} (its cohort file is at {f.version}): kept "
        "from the last build"
        for f in built.frozen
    ]
    lines.append(f"task set {built.name}: {built.task_set.hex()} (build {built.build.hex()[:12]})")
    lines += [f"note: {n}" for n in data["notes"]]
    if built.frozen:
        lines.append(
            f"  frozen: it keeps its last build for {len(built.frozen)} pair(s) whose cohort "
            "moved to a new N; a new N enters only a new task set"
        )
    emit(args, to_builtins(data), lines)
    return EXIT_OK


def cmd_taskset_show(args: argparse.Namespace) -> int:
    """The recorded set: its hash, pairs pinned at N, arms, builder and its latest build."""
    with open_store(args) as store:
        view = show_set(store, args.name)
    rec = view.record
    data = {
        "name": view.name,
        "task_set": view.task_set,
        "builder": rec.builder,
        "arms": list(rec.arms),
        "pairs": [{"task": p.task, "n": p.n} for p in rec.pairs],
        "build": view.build,
        "entries": [
            {
                "pair": e.pair,
                "version": e.version,
                "arm": e.arm,
                "arm_variant": e.arm_variant,
                "config_hash": e.config,
                "result": e.result,
            }
            for e in view.entries
        ],
    }
    lines = [
        f"task set {view.name}",
        f"  hash     {view.task_set.hex()}",
        f"  builder  {rec.builder}",
        f"  arms     {', '.join(rec.arms)}",
        "  pairs    " + ", ".join(f"{p.task} (N={p.n})" for p in rec.pairs),
    ]
    if view.build is None:
        lines.append("  not built yet")
    else:
        lines.append(f"  build    {view.build.hex()}")
        for e in view.entries:
            arm = arm_label(e.arm, e.arm_variant)
            lines.append(f"    {e.pair:<34} {e.version:<6} {arm:<28} {e.config.hex()[:12]}")
    emit(args, to_builtins(data), lines)
    return EXIT_OK


def cmd_taskset_publish(args: argparse.Namespace) -> int:
    """Write the set's bundle: configs only, or with --with-data the whole build (answer
    keys included; refused for credentialed data)."""
    folders = workspace_folders()
    with open_store(args) as store:
        info = publish(
            store,
            args.name,
            args.output,
            with_data=args.with_data,
            studio=folders.get("studio", args.studio),
            bench=folders.get("bench", args.bench),
            with_commitment=not args.no_commitment,
        )
    what = (
        "with data: evidence and answer keys"
        if args.with_data
        else "configs only: no patient data, no answers"
    )
    emit(
        args,
        to_builtins(info),
        f"wrote {info.path}: {info.objects} objects, {info.bytes} bytes ({what})",
    )
    return EXIT_OK


def cmd_taskset_rebuild(args: argparse.Namespace) -> int:
    """Build a published set from its bundle and your own dataset and compare ids pair by
    pair (exit 1 when any differs); when all match, the set is recorded here."""
    with open_store(args, create=True) as store:
        name, rows = porcelain.rebuild_set(
            store,
            args.bundle,
            folders=workspace_folders(),
            studio=args.studio,
            bench=args.bench,
            dataset=args.dataset,
            data_root=args.data_root,
            progress=bars(args),
        )
    ok = all(r.ok for r in rows)
    lines = [f"task set {name}: " + ("every id matches" if ok else "some ids differ")]
    for r in rows:
        arm = arm_label(r.arm, r.arm_variant)
        detail = f" ({r.detail})" if r.detail else ""
        lines.append(f"  {r.pair:<34} {arm:<28} {r.status}{detail}")
    data = {"name": name, "ok": ok, "pairs": [to_builtins(r) for r in rows]}
    emit(args, data, lines)
    return EXIT_OK if ok else EXIT_PROBLEM


def cmd_taskset_commit(args: argparse.Namespace) -> int:
    """Commit to the answers of the set's latest build: a salted Merkle root, publishable;
    the salts stay in this store with the answer keys."""
    with open_store(args) as store:
        done = porcelain.commit_set(store, args.name)
    rec = done.record
    data = {
        "set": done.set,
        "commitment": done.commitment.hex(),
        "new": done.new,
        "ref": done.ref,
        "root": rec.root,
        "leaves": rec.leaves,
        "scheme": rec.scheme,
        "set_build": rec.set_build,
    }
    state = "committed" if done.new else "already committed"
    lines = [
        f"{state} {done.set}: commitment {done.commitment.hex()} ({done.ref})",
        f"  root {rec.root}, {rec.leaves} leaves, set build {rec.set_build[:12]}",
        f"  scheme {rec.scheme}",
    ]
    emit(args, data, lines)
    return EXIT_OK


def cmd_taskset_reveal(args: argparse.Namespace) -> int:
    """Write the openings (answer, salt, inclusion proof) of some or all atoms."""
    with open_store(args) as store:
        doc = porcelain.reveal_set(
            store,
            args.name,
            args.output,
            atoms=args.atoms,
            folders=workspace_folders(),
            studio=args.studio,
            allow_credentialed=args.reveal_credentialed,
        )
    n = len(doc["openings"])
    data = {"path": args.output, "commitment": doc["commitment"], "openings": n}
    emit(args, data, f"wrote {args.output}: {n} openings of commitment {doc['commitment']}")
    return EXIT_OK


def cmd_template_signoff(args: argparse.Namespace) -> int:
    """Freeze a template: later changes need the version rises of its cohorts."""
    studio = workspace_folders().get("studio", args.studio)
    path = find_template(studio, args.template)
    if path is None:
        raise SpecError(studio / "datasets", None, "", f"no template {args.template!r}")
    folder = load_template(path)
    with open_store(args, create=True) as store:
        rid = signoff(store, folder)
    versions = {n: str(c.version) for n, c in folder.cohorts.items()}
    emit(
        args,
        to_builtins({"template": folder.name, "id": rid, "cohorts": versions}),
        f"signed off {folder.name}: {rid.hex()} ("
        + ", ".join(f"{n} {v}" for n, v in versions.items())
        + ")",
    )
    return EXIT_OK


def shard_arg(text: str) -> tuple[int, int]:
    """``I/N`` -> (I, N), 0 <= I < N."""
    i, sep, n = text.partition("/")
    try:
        shard = (int(i), int(n))
    except ValueError:
        shard = (-1, 0)
    if not sep or not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise argparse.ArgumentTypeError(f"want I/N with 0 <= I < N, such as 0/4; got {text!r}")
    return shard


# -- parser --------------------------------------------------------------------------------------
def _folders(p: argparse.ArgumentParser, *, bench: bool = False, data: bool = False) -> None:
    p.add_argument("--studio", metavar="DIR", help="studio folder (default: the workspace's)")
    if bench:
        p.add_argument("--bench", metavar="DIR", help="bench folder (default: the workspace's)")
    if data:
        p.add_argument(
            "--data-root",
            metavar="DIR",
            help="where the dataset's files are (default: the dataset's folder)",
        )


def _group(
    parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    p = parent.add_parser(name, help=help, parents=[common_options()])
    p.set_defaults(handler=None, parser=p)
    return p.add_subparsers(title="verbs", metavar="VERB")


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``studio`` and its verbs to the top-level subcommands."""
    studio = _group(groups, "studio", "build tasks and task sets from templates and cohorts")

    task = _group(studio, "task", "one pair, <template>@<cohort>")
    p = add_command(task, "build", cmd_task_build, "build a pair under its arms")
    p.add_argument("pair", metavar="TEMPLATE@COHORT")
    p.add_argument("--arm", action="append", metavar="ARM", help="an arm (repeatable)")
    _folders(p, data=True)

    ts = _group(studio, "taskset", "task sets, <benchmark>/<set>")
    p = add_command(ts, "build", cmd_taskset_build, "build a task set and record it")
    p.add_argument("name", metavar="BENCHMARK/SET")
    p.add_argument(
        "--shard",
        type=shard_arg,
        metavar="I/N",
        help="build only shard I of N (0-based) and record nothing",
    )
    _folders(p, bench=True, data=True)
    p = add_command(ts, "show", cmd_taskset_show, "show a recorded task set and its build")
    p.add_argument("name", metavar="BENCHMARK/SET")
    p = add_command(ts, "publish", cmd_taskset_publish, "write a task set's bundle")
    p.add_argument("name", metavar="BENCHMARK/SET")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the bundle to write")
    holds = p.add_mutually_exclusive_group()
    holds.add_argument(
        "--with-data",
        action="store_true",
        help="the whole build: evidence and answer keys (refused for credentialed data); "
        "without it, only the configs and the ids they build to",
    )
    # the default since --with-data: kept so that scripts written before keep working
    holds.add_argument("--configs-only", action="store_true", help="the default (kept for scripts)")
    p.add_argument(
        "--no-commitment",
        action="store_true",
        help="leave out the set's answer commitment (by default it goes along when the "
        "set has one for this build; its salts never do)",
    )
    _folders(p, bench=True)
    p = add_command(ts, "rebuild", cmd_taskset_rebuild, "rebuild a published set and compare")
    p.add_argument("bundle", metavar="BUNDLE")
    p.add_argument(
        "--dataset",
        metavar="DIR",
        help="your own dataset's folder, holding its dataset.yaml (default: the studio's "
        "datasets/<name>/); no template or set file is read",
    )
    p.add_argument("--bench", metavar="DIR", help=argparse.SUPPRESS)  # not read; old scripts
    _folders(p, data=True)

    p = add_command(
        ts, "commit", cmd_taskset_commit, "commit to a set's answers (a salted Merkle root)"
    )
    p.add_argument("name", metavar="BENCHMARK/SET")
    p = add_command(ts, "reveal", cmd_taskset_reveal, "open a committed set's answers with proofs")
    p.add_argument("name", metavar="BENCHMARK/SET")
    p.add_argument(
        "--atoms",
        nargs="+",
        metavar="ATOM",
        help="atom ids or unique prefixes (8+ hex characters); default: every atom",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    p.add_argument(
        "--reveal-credentialed",
        action="store_true",
        help="reveal a set that reads credentialed data (its answers are patient data)",
    )
    _folders(p)

    tpl = _group(studio, "template", "templates")
    p = add_command(tpl, "signoff", cmd_template_signoff, "freeze a template")
    p.add_argument("template", metavar="TEMPLATE")
    _folders(p)
