"""``medomni cas …``: the object store's verbs, one small function each.

Every verb opens the store named by ``--store`` (default: the workspace's), calls library
functions and prints their result as text or, with ``--json``, as JSON on stdout. Ids print
in full; anywhere an id is read, a unique prefix of at least 8 hex characters or a ref name
will do.

Output that scales: ``refs`` lists a namespace of up to `LISTED_PER_NAMESPACE` refs and
shows a bigger one (``runs/slots/``) as one counted line; ``push``/``pull``/``clone`` count
refs by outcome and list only the refs that failed. ``-v`` prints every line, ``--json``
always gives everything.

``push`` / ``pull`` (`medomni_cas.porcelain`) name a remote from the workspace's
``remotes:`` (default ``origin``, or the only one) or take a store URL; ``clone URL DEST``
makes a new store. Transfers draw a progress line on stderr when it is a terminal. The
workspace file is read and written through `medomni_cas.workspace` only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import medomni_cas as mc
from medomni_cas import porcelain
from medomni_cas.cli._output import (
    EXIT_OK,
    EXIT_PROBLEM,
    add_command,
    add_jobs_option,
    common_options,
    emit,
    emit_json,
    encode_json,
    isotime,
    json_mode,
    open_store,
    to_builtins,
)
from medomni_cas.cli._progress import bar
from medomni_cas.errors import ConflictError, InvalidName, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.refs import check_ref_name
from medomni_cas.workspace import DEFAULT_REMOTE, DEFAULT_STORE_URL, WORKSPACE_FILE, Workspace

if TYPE_CHECKING:
    from medomni_cas.store.sync import SyncProgress, SyncReport
    from medomni_cas.store.verify import FsckReport

__all__ = ["register"]

_PIECE = 1 << 20  # cat streams blobs in pieces of this size: bounded memory for any blob


def _hex(oid: ObjectId | str | None) -> str:
    if not oid:
        return "-"
    return oid if isinstance(oid, str) else oid.hex()


# -- verbs ---------------------------------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> int:
    """Create (or open) the store; with --workspace, record it in ./workspace.yaml."""
    ws = Workspace.load(".")
    given = getattr(args, "store", None)
    with mc.open(given or ws.store_url) as store:
        url = store.url
    if args.workspace:
        # the URL as the user wrote it (relative paths stay relative to the workspace)
        ws.set_store(given or ws.settings.store or DEFAULT_STORE_URL)
    emit(args, {"url": url, "workspace": args.workspace}, url)
    return EXIT_OK


def cmd_put(args: argparse.Namespace) -> int:
    """Store a file or stdin as a blob, or a directory as a tree; optionally set a ref."""
    source: str = args.path
    if args.ref:
        check_ref_name(args.ref)  # before storing anything: a bad name is an input error
    with open_store(args, create=True) as store:
        if source == "-":
            oid, kind = store.put_blob(sys.stdin.buffer), "blob"
        elif Path(source).is_dir():
            from medomni_cas.store.trees import put_directory

            oid, kind = put_directory(store, source), "tree"
        else:
            oid, kind = store.put_blob(source), "blob"
        if args.ref:
            store.refs.set(args.ref, oid, message=args.message or f"put {source}")
    data: dict[str, Any] = {"id": oid, "kind": kind}
    if args.ref:
        data["ref"] = args.ref
    emit(args, data, oid.hex())
    return EXIT_OK


def cmd_cat(args: argparse.Namespace) -> int:
    """Write a blob's bytes to stdout (``--json`` does not apply: the bytes are the output)."""
    with open_store(args) as store:
        reader = store.open_blob(store.resolve(args.id))
        sys.stdout.flush()
        out = sys.stdout.buffer
        while piece := reader.read(_PIECE):
            out.write(piece)
        out.flush()
    return EXIT_OK


def describe(oid: ObjectId, data: bytes) -> dict[str, Any]:
    """An object's canonical bytes as plain JSON-able values, with its id and kind."""
    kind, version = encoding.kind_of(data)
    if kind == encoding.BLOB:
        # the payload is what `cat` is for; show only its size
        return to_builtins({"id": oid, "kind": kind, "size": len(encoding.blob_data(data))})
    _, _, body = encoding.decode(data)
    out: dict[str, Any] = {"id": oid, "kind": kind, "version": version}
    if kind == encoding.TREE:
        out["entries"] = dict(sorted(body.items()))
    else:
        out["body"] = body
    return to_builtins(out)


def cmd_show(args: argparse.Namespace) -> int:
    """Print an object decoded, as JSON (indented unless --json)."""
    with open_store(args) as store:
        oid = store.resolve(args.id)
        shown = describe(oid, store.get_raw(oid))
    sys.stdout.write(encode_json(shown, indent=0 if json_mode(args) else 2) + "\n")
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    """List a tree: kind, size, id and name of each entry."""
    from medomni_cas.store.trees import ls_tree

    with open_store(args) as store:
        rows = ls_tree(store, store.resolve(args.id))
    data = [{"name": n, "id": i, "kind": k, "size": s} for n, i, k, s in rows]
    width = max((len(k) for _, _, k, _ in rows), default=4)
    text = [f"{k:<{width}} {'-' if s is None else s:>12} {i.hex()}  {n}" for n, i, k, s in rows]
    emit(args, data, text)
    return EXIT_OK


#: ``cas refs`` lists a namespace of at most this many refs; a bigger one is one line.
LISTED_PER_NAMESPACE = 10


def _namespace(prefix: str, name: str) -> str:
    """The namespace of a ref below ``prefix``: at most two more folders (``runs/slots/``)."""
    folders = name[len(prefix) :].split("/")[:-1][:2]
    return prefix + "".join(f + "/" for f in folders)


def cmd_refs(args: argparse.Namespace) -> int:
    """List refs (under PREFIX): name -> id; a big namespace is summarised unless -v."""
    with open_store(args) as store:
        refs = dict(store.refs.items(args.prefix))
    counts = Counter(_namespace(args.prefix, name) for name in refs)
    text: list[str] = []
    shown: set[str] = set()
    for name, oid in refs.items():
        space = _namespace(args.prefix, name)
        if args.verbose or counts[space] <= LISTED_PER_NAMESPACE:
            text.append(f"{oid.hex()} {name}")
        elif space not in shown:
            shown.add(space)
            text.append(f"{f'({counts[space]:,} refs)':>64} {space}...")
    if shown:
        text.append(f"{len(refs):,} refs; -v lists every one")
    emit(args, refs, text)
    return EXIT_OK


def cmd_ref_set(args: argparse.Namespace) -> int:
    """Point a ref at an object: compare-and-swap with --expect, create-only with --create."""
    with open_store(args) as store:
        new = store.resolve(args.id)
        if args.create:
            expected: ObjectId | None = None
        elif args.expect is not None:
            expected = store.resolve(args.expect)
        else:
            expected = store.refs.get(args.name)
        store.refs.set(args.name, new, expected=expected, message=args.message, force=_forced(args))
    emit(args, {"name": args.name, "old": expected, "new": new}, f"{new.hex()} {args.name}")
    return EXIT_OK


def cmd_ref_delete(args: argparse.Namespace) -> int:
    """Delete a ref (its history is kept)."""
    with open_store(args) as store:
        old = store.refs[args.name] if args.expect is None else store.resolve(args.expect)
        store.refs.delete(args.name, expected=old, message=args.message, force=_forced(args))
    emit(args, {"name": args.name, "old": old}, f"deleted {args.name} (was {old.hex()})")
    return EXIT_OK


def _forced(args: argparse.Namespace) -> bool:
    """``--force``, which overrides the ref update policies, only with ``-m`` saying why
    (the history records both)."""
    if args.force and not args.message.strip():
        raise ValueError("--force needs -m MESSAGE saying why (it goes into the ref's history)")
    return bool(args.force)


def cmd_log(args: argparse.Namespace) -> int:
    """A ref's history, oldest first: time, old id, new id, message."""
    with open_store(args) as store:
        entries = store.refs.history(args.name)
    if not entries:
        raise NotFound("ref", args.name)
    data: list[dict[str, Any]] = [
        {
            "time": isotime(e.time),
            "timestamp": e.time,
            "old": e.old_id,
            "new": e.new_id,
            "message": e.message,
            "forced": e.forced,
        }
        for e in entries
    ]
    text = [
        f"{d['time']}  {_hex(d['old'])}  {_hex(d['new'])}  "
        f"{'(forced) ' if d['forced'] else ''}{d['message']}".rstrip()
        for d in data
    ]
    emit(args, data, text)
    return EXIT_OK


def cmd_fsck(args: argparse.Namespace) -> int:
    """Verify every object and ref; exit 1 when anything is wrong. With --repair --from,
    fetch good copies of what is corrupt or missing first; exit 1 if anything is left."""
    from medomni_cas.store.verify import fsck

    if args.repair and not args.source:
        raise ValueError("cas fsck --repair needs --from URL: a store that holds good copies")
    if args.source and not args.repair:
        raise ValueError("cas fsck --from URL is for --repair: give both, or neither")
    if args.repair:
        return _repair(args)
    with open_store(args) as store, bar(args, None, "obj", "fsck") as b:
        report = fsck(store, jobs=args.jobs, progress=lambda n: b.update(n - b.n))
    if json_mode(args):
        emit_json(to_builtins(report))
    else:
        _print_fsck(report)
    return EXIT_OK if report.ok else EXIT_PROBLEM


def _print_fsck(report: FsckReport) -> None:
    for p in report.problems:
        where = f" (ref {p.ref})" if p.ref else ""
        sys.stdout.write(f"{p.kind} {_hex(p.id)}{where}: {p.message}\n")
    status = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    sys.stdout.write(f"{status}: {report.objects} objects, {report.refs} refs\n")


def _repair(args: argparse.Namespace) -> int:
    from medomni_cas.store.repair import repair
    from medomni_cas.store.url import open_store as open_url

    spec: str = args.source
    url = spec if "://" in spec else Workspace.load(".").remote_url(spec)
    with (
        open_store(args) as store,
        open_url(url, create=False) as source,
        bar(args, None, "obj", "fsck") as b,
    ):
        report = repair(store, source, jobs=args.jobs, progress=lambda n: b.update(n - b.n))
    if json_mode(args):
        emit_json(to_builtins({**to_builtins(report), "ok": report.ok}))
        return EXIT_OK if report.ok else EXIT_PROBLEM
    if report.before.ok:
        sys.stdout.write("nothing to repair\n")
    else:
        sys.stdout.write(f"found {len(report.before.problems)} problem(s):\n")
        _print_fsck(report.before)
        sys.stdout.write(f"fetched {report.fetched} objects from {report.source}\n")
    for oid, why in report.failed.items():
        sys.stdout.write(f"not repaired {oid}: {why}\n")
    sys.stdout.write("after repair:\n" if not report.before.ok else "")
    _print_fsck(report.after)
    return EXIT_OK if report.ok else EXIT_PROBLEM


def cmd_gc(args: argparse.Namespace) -> int:
    """Delete objects no ref reaches and older than the grace period."""
    from medomni_cas.store.gc import gc

    with open_store(args) as store:
        report = gc(
            store,
            grace=args.grace,
            reflog_retention=args.reflog_retention,
            dry_run=args.dry_run,
        )
    verb = "would sweep" if report.dry_run else "swept"
    text = [_hex(oid) for oid in report.swept_ids] if report.dry_run else []
    text.append(
        f"{report.reachable} reachable, {verb} {report.swept}, "
        f"kept {report.kept_young} younger than {args.grace:g}s"
        + (f", removed {report.orphans} leftovers of killed writers" if report.orphans else "")
    )
    emit(args, to_builtins(report), text)
    return EXIT_OK


def cmd_repack(args: argparse.Namespace) -> int:
    """Merge a remote store's small packs into large ones (fewer indexes for readers)."""
    with open_store(args) as store:
        backend = getattr(store.backend, "remote", store.backend)  # a cached store's remote
        repack = getattr(backend, "repack", None)
        merged = repack() if repack is not None else 0
    emit(args, {"url": store.url, "merged": merged}, f"merged {merged} packs")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """Write the objects reachable from ROOTs (and named refs) to a bundle file."""
    from medomni_cas.store.bundle import export_bundle

    with open_store(args) as store:
        roots: dict[ObjectId, None] = {}  # ordered and without repeats
        refs: dict[str, ObjectId] = {}
        for spec in args.roots:
            oid = store.resolve(spec)
            roots[oid] = None
            if _is_ref(store, spec, oid):
                refs[spec] = oid
        for name in args.ref:
            refs[name] = store.refs[name]
            roots[refs[name]] = None
        info = export_bundle(store, list(roots), args.output, refs=refs or None)
    text = f"wrote {info.objects} objects ({info.bytes} bytes) to {info.path}"
    emit(args, to_builtins(info), text)
    return EXIT_OK


def _is_ref(store: mc.Store, spec: str, oid: ObjectId) -> bool:
    # resolve prefers an id prefix over a ref name, so a ref counts only if it is what resolved
    try:
        return store.refs.get(check_ref_name(spec)) == oid
    except InvalidName:
        return False


def cmd_import(args: argparse.Namespace) -> int:
    """Read a bundle into the store, updating its refs unless --no-refs."""
    path = Path(args.file)
    if not path.is_file():
        # say so now, naming the file, rather than through whatever the reader raises
        raise FileNotFoundError(2, "no such bundle file", str(path))
    from medomni_cas.store.bundle import import_bundle

    with open_store(args, create=True) as store:
        report = import_bundle(store, path, refs=args.refs)
    names = ", ".join(report.refs_updated) or "none"
    text = f"{report.objects} objects ({report.new} new); refs updated: {names}"
    emit(args, to_builtins(report), text)
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    """Print the full id of a prefix or ref name (an ambiguous prefix lists candidates)."""
    with open_store(args) as store:
        oid = store.resolve(args.spec)
    emit(args, {"id": oid}, oid.hex())
    return EXIT_OK


# -- remotes -------------------------------------------------------------------------------------
class _ProgressLine:
    """A one-line transfer counter on stderr, redrawn at most ten times a second, drawn
    only when stderr is a terminal."""

    def __init__(self, verb: str, moved: str) -> None:
        self.verb, self.moved = verb, moved
        self.enabled = sys.stderr.isatty()
        self.last = 0.0
        self.latest: SyncProgress | None = None
        self.drawn = False

    def __call__(self, p: SyncProgress) -> None:
        self.latest = p
        now = time.monotonic()
        if self.enabled and now - self.last >= 0.1:
            self.last = now
            self._draw(p)

    def _draw(self, p: SyncProgress) -> None:
        sys.stderr.write(
            f"\r{self.verb}: {p.sent:,} objects ({p.bytes / 1e6:,.1f} MB) {self.moved}, "
            f"{p.checked:,} checked\x1b[K"
        )
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn and self.latest is not None:
            self._draw(self.latest)
        if self.drawn:
            sys.stderr.write("\n")


def _short(value: str | None) -> str:
    return "-" if value is None else value[:12]


#: How ``push``/``pull`` count refs by outcome, in this order; the failures are also listed.
_OUTCOMES = ("created", "updated", "unchanged", "rejected", "refused", "conflict")
_FAILED = ("rejected", "refused", "conflict")


def _emit_sync(args: argparse.Namespace, report: SyncReport, what: str) -> None:
    lines = [
        f"{what}: {report.objects:,} objects ({report.bytes / 1e6:,.1f} MB), "
        f"{report.checked:,} ids checked"
    ]
    counts = Counter(r.status for r in report.refs)
    order = [*_OUTCOMES, *sorted(set(counts) - set(_OUTCOMES))]
    lines.append("refs: " + (", ".join(f"{counts[s]:,} {s}" for s in order if counts[s]) or "none"))
    for r in report.refs:
        if not (args.verbose or r.status in _FAILED):
            continue
        change = _short(r.new) if r.old is None else f"{_short(r.old)} -> {_short(r.new)}"
        if r.status == "unchanged":
            change = _short(r.new)
        elif r.status == "conflict":
            change += f" (now {_short(r.current)})"
        elif r.status == "refused":
            change += f" ({r.reason})"
        lines.append(f"  {r.status:<9} {r.name}  {change}")
    emit(args, to_builtins(report), lines)


def _sync(
    args: argparse.Namespace,
    verb: str,
    moved: str,
    what: Callable[[SyncReport], str],
    run: Callable[[Any], SyncReport],
) -> int:
    progress = _ProgressLine(verb, moved)
    try:
        try:
            report = run(progress)
        finally:
            progress.close()
    except ConflictError as e:
        # the other refs were done: show them, then the error names the one that failed
        partial = getattr(e, "report", None)
        if partial is not None and not json_mode(args):
            _emit_sync(args, partial, what(partial))
        raise
    _emit_sync(args, report, what(report))
    return EXIT_OK


def cmd_push(args: argparse.Namespace) -> int:
    """Send refs (default: all) and the objects they reach that the remote lacks."""
    with open_store(args) as local:
        return _sync(
            args,
            "push",
            "sent",
            lambda r: f"push to {r.dst}",
            lambda cb: porcelain.push(
                local,
                args.remote,
                args.refs or None,
                force=_forced(args),
                message=args.message,
                progress=cb,
                single_writer=getattr(args, "single_writer", False),
            ),
        )


def cmd_pull(args: argparse.Namespace) -> int:
    """Fetch refs (default: all) and the objects they reach that this store lacks."""
    # the remote first: a pull from a mistyped remote must not leave a new empty local store
    with (
        porcelain.open_remote(args.remote, ".", create=False) as remote,
        open_store(args, create=True) as local,
    ):
        return _sync(
            args,
            "pull",
            "fetched",
            lambda r: f"pull from {r.src}",
            lambda cb: porcelain.pull(
                local,
                remote,
                args.refs or None,
                force=_forced(args),
                message=args.message,
                progress=cb,
            ),
        )


def cmd_clone(args: argparse.Namespace) -> int:
    """Copy a store (all its refs and what they reach) into a new store at DEST."""
    from medomni_cas.store.sync import clone

    ws = Workspace.load(".")
    if args.workspace:  # refuse before copying anything
        ws.check_store(args.dest)
        ws.check_remote(DEFAULT_REMOTE, args.url)
    single = getattr(args, "single_writer", False)
    code = _sync(
        args,
        "clone",
        "fetched",
        lambda r: f"clone of {args.url} into {args.dest}",
        lambda cb: clone(args.url, args.dest, progress=cb, single_writer=single),
    )
    if args.workspace:
        ws.set_store(args.dest).add_remote(DEFAULT_REMOTE, args.url)
    return code


# -- parsers -------------------------------------------------------------------------------------
_GROUP_HELP = """\
the content-addressed object store

Everything MedOmni keeps lives in it: objects (blobs, trees, records) named by the BLAKE3
hash of their bytes, and refs (names -> ids, moved only by compare-and-swap, with a
history). An ID is a full id, a unique prefix of at
least 8 hex characters, or a ref name. The store is --store URL, else the workspace's.

objects:      init, put, cat, show, ls, resolve
refs:         refs, ref set|delete, log
maintenance:  fsck (re-hash everything; --repair --from URL), gc, repack
bundles:      export, import (one file holding objects and refs)
remotes:      push, pull (to and from workspace.yaml's remotes or a URL), clone

Output is a summary where a store grows large (refs, push, pull); -v or --json gives
every line."""


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cas`` and its verbs to the top-level subcommands."""
    cas = groups.add_parser(
        "cas",
        help="the content-addressed object store",
        description=_GROUP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options()],
    )
    cas.set_defaults(handler=None, parser=cas)
    verbs = cas.add_subparsers(title="verbs", metavar="VERB")

    p = add_command(verbs, "init", cmd_init, "create or open the store and print its URL")
    p.add_argument(
        "--workspace", action="store_true", help=f"also record the store in ./{WORKSPACE_FILE}"
    )

    p = add_command(verbs, "put", cmd_put, "store a file, directory or stdin (-); print its id")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--ref", metavar="NAME", help="also point this ref at the new object")
    p.add_argument("-m", "--message", default="", help="message for the ref's history")

    p = add_command(verbs, "cat", cmd_cat, "write a blob's bytes to stdout")
    p.add_argument("id", metavar="ID")

    p = add_command(verbs, "show", cmd_show, "print an object decoded, as JSON")
    p.add_argument("id", metavar="ID")

    p = add_command(verbs, "ls", cmd_ls, "list a tree's entries")
    p.add_argument("id", metavar="ID")

    p = add_command(verbs, "refs", cmd_refs, "list refs (a big namespace as one line)")
    p.add_argument("prefix", metavar="PREFIX", nargs="?", default="")
    _verbose_argument(p, "list every ref")

    ref = verbs.add_parser("ref", help="change one ref", parents=[common_options()])
    ref.set_defaults(handler=None, parser=ref)
    ref_verbs = ref.add_subparsers(title="verbs", metavar="VERB")
    p = add_command(ref_verbs, "set", cmd_ref_set, "point a ref at an object")
    p.add_argument("name", metavar="NAME")
    p.add_argument("id", metavar="ID")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--expect", metavar="OLD", help="only if the ref points at OLD now")
    only.add_argument("--create", action="store_true", help="only if the ref does not exist")
    p.add_argument("-m", "--message", default="", help="message for the ref's history")
    _force_argument(p, "move the ref even though its update policy refuses")
    p = add_command(ref_verbs, "delete", cmd_ref_delete, "delete a ref")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--expect", metavar="OLD", help="only if the ref points at OLD now")
    p.add_argument("-m", "--message", default="", help="message for the ref's history")
    _force_argument(p, "delete the ref even though its update policy refuses")

    p = add_command(verbs, "log", cmd_log, "show a ref's history")
    p.add_argument("name", metavar="NAME")

    p = add_command(verbs, "fsck", cmd_fsck, "verify objects and refs (exit 1 on a problem)")
    add_jobs_option(p)
    p.add_argument(
        "--repair",
        action="store_true",
        help="fetch good copies of corrupt or missing objects (from --from), then check again",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        help=f"the store to repair from: a store URL or a remote named in {WORKSPACE_FILE}",
    )

    p = add_command(verbs, "gc", cmd_gc, "delete unreachable objects")
    p.add_argument(
        "--grace",
        type=float,
        default=86400.0,
        metavar="SECONDS",
        help="keep unreachable objects written this recently (default: one day)",
    )
    p.add_argument(
        "--reflog-retention",
        type=float,
        default=30 * 86400.0,
        metavar="SECONDS",
        help="ids in ref histories younger than this stay reachable (default: 30 days)",
    )
    p.add_argument("--dry-run", action="store_true", help="report, delete nothing")

    add_command(verbs, "repack", cmd_repack, "merge a remote store's small packs")

    p = add_command(verbs, "export", cmd_export, "write objects to a bundle file")
    p.add_argument("roots", metavar="ROOT", nargs="+", help="id, id prefix or ref name")
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument(
        "--ref", action="append", default=[], metavar="NAME", help="also export this ref"
    )

    p = add_command(verbs, "import", cmd_import, "read a bundle file into the store")
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--no-refs", dest="refs", action="store_false", help="import objects, leave refs alone"
    )

    p = add_command(verbs, "resolve", cmd_resolve, "print the full id of a prefix or ref")
    p.add_argument("spec", metavar="PREFIX")

    p = add_command(verbs, "push", cmd_push, "send refs and what they reach to a remote")
    _sync_arguments(p)

    p = add_command(verbs, "pull", cmd_pull, "fetch refs and what they reach from a remote")
    _sync_arguments(p)

    p = add_command(verbs, "clone", cmd_clone, "copy a store into a new one")
    p.add_argument("url", metavar="URL", help="the store to copy")
    p.add_argument("dest", metavar="DEST", help="URL of the new store")
    p.add_argument(
        "--workspace",
        action="store_true",
        help=f"record DEST as the store and URL as remote {DEFAULT_REMOTE!r} in ./{WORKSPACE_FILE}",
    )
    _verbose_argument(p, "list every ref, not only counts by outcome")


def _verbose_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help=f"{what} (--json: always)")


def _sync_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "remote",
        metavar="REMOTE",
        nargs="?",
        help=f"a remote named in {WORKSPACE_FILE}, or a store URL (default: "
        f"{DEFAULT_REMOTE!r}, or the only remote)",
    )
    p.add_argument("refs", metavar="REF", nargs="*", help="the refs (default: all)")
    _force_argument(
        p,
        "move refs even when that drops a value the other side never saw, or their update "
        "policy refuses",
    )
    p.add_argument(
        "-m", "--message", default="", help="why, with --force (for the refs' histories)"
    )
    _verbose_argument(p, "list every ref, not only counts by outcome")


def _force_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--force", action="store_true", help=f"{what}; needs -m saying why (recorded)")
