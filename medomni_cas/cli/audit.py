"""``medomni audit …``: where a score came from, whether it is intact, how two differ.

* ``show <result> [--runs]``: the provenance tree, from the result down to the templates,
  cohorts and their versions, build configs, dataset release, builder, agent config,
  served models, runs, predictions and answer keys;
* ``verify <result>``: re-hash every object of the result's closure, make the answer
  columns it was scored against again from its answer keys, and compute its score again
  from its jobs, comparing every row and link; exit 1 naming each missing or corrupt
  object and where it sits, and each row or link that is not what the jobs give;
* ``diff <a> <b>``: which inputs of two results differ (exit 1 when they differ, as
  ``git diff --exit-code``);
* ``export <result> [-o FILE]``: W3C PROV-JSON;
* ``attest <result> --key KEY -o FILE``: verify the result and sign an in-toto statement
  of it (a DSSE envelope; `medomni_cas.audit.attest`), stored under
  ``attestations/<set>/<keyid>`` too; exit 1 when the result fails (it is attested as
  FAILED);
* ``verify-attestation FILE --pub KEY [--store URL]``: check the signature; with
  ``--store``, also that the subject is there and verifies to the same statement;
* ``verify-reveal FILE [--commitment ID]``: check revealed answers against the published
  answer commitment (the file's, or ``--commitment``; the object must be in the store).

``<result>`` is a set name such as ``medomni-bench/v1`` (its latest score), an id, a
unique prefix of 8+ hex characters, or a ref name such as ``results/medomni-bench/v1``
(what ``medomni bench score`` writes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medomni_cas import porcelain
from medomni_cas.audit.attest import attestation_lines
from medomni_cas.audit.diff import render_text as diff_text
from medomni_cas.audit.provenance import render_text as provenance_text
from medomni_cas.audit.verify import render_text as verify_text
from medomni_cas.cli._output import (
    EXIT_OK,
    EXIT_PROBLEM,
    add_command,
    add_jobs_option,
    common_options,
    emit,
    encode_json,
    open_store,
    to_builtins,
)
from medomni_cas.cli._progress import bars

__all__ = ["register"]

_RESULT = "a set name (its latest score), an id, a unique prefix or a ref name"


def cmd_show(args: argparse.Namespace) -> int:
    """The provenance tree of a result (a summary; ``--runs`` lists every run)."""
    with open_store(args) as store:
        found = porcelain.find_comparison(store, args.result)
        if found is not None:
            from medomni_cas.bench.contrasts import comparison_lines

            cid, record = found
            signed = porcelain.attestations(store, cid)
            emit(
                args,
                to_builtins({"comparison": cid, **to_builtins(record), "attestations": signed}),
                comparison_lines(cid, record) + attestation_lines(signed),
            )
            return EXIT_OK
        p = porcelain.provenance(store, args.result, runs=args.runs)
    emit(args, to_builtins(p), provenance_text(p))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Re-hash the result's closure and compute its score again; exit 1 when any object is
    missing or corrupt, or a row or link is not what its jobs give."""
    with open_store(args) as store:
        report = porcelain.verify(
            store, args.result, canonical=args.canonical, jobs=args.jobs, progress=bars(args)
        )
    emit(args, to_builtins(report), verify_text(report))
    return EXIT_OK if report.ok else EXIT_PROBLEM


def cmd_diff(args: argparse.Namespace) -> int:
    """Which inputs of two results differ: exit 1 when they differ, 0 when they are one."""
    with open_store(args) as store:
        d = porcelain.diff(store, args.a, args.b, limit=None if args.all else args.limit)
    data = {"a": d.a.hex(), "b": d.b.hex(), "differences": to_builtins(d.differences)}
    header = [f"A {d.a.hex()}", f"B {d.b.hex()}"]
    emit(args, data, header + diff_text(d.differences))
    return EXIT_PROBLEM if d.differences else EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """The result's provenance as W3C PROV-JSON, on stdout or in a file."""
    with open_store(args) as store:
        doc = porcelain.export(store, args.result, max_items=args.max_items)
    text = encode_json(doc, indent=2) + "\n"
    if args.output is None or args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    path = Path(args.output)
    path.write_text(text)
    counts = {k: len(v) for k, v in doc.items() if k != "prefix"}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    emit(args, {"path": str(path), **counts}, f"wrote {path}: {summary}")
    return EXIT_OK


def cmd_attest(args: argparse.Namespace) -> int:
    """Verify a result and sign its in-toto statement; exit 1 when it fails verification."""
    with open_store(args) as store:
        done = porcelain.attest(store, args.result, args.key, output=args.output)
    data = {
        "subject": done.subject.hex(),
        "name": done.subject_name,
        "result": done.check.result,
        "keyid": done.keyid,
        "attestation": done.attestation.hex(),
        "ref": done.ref,
        "path": args.output,
        "failed": list(done.check.failed),
        "messages": list(done.check.messages),
    }
    lines = [
        f"{done.subject_name} {done.subject.hex()}: {done.check.result}",
        f"  signed by keyid {done.keyid}; wrote {args.output}",
        f"  stored attestation {done.attestation.hex()} as {done.ref}",
    ]
    lines += [f"  {m}" for m in done.check.messages]
    emit(args, data, lines)
    return EXIT_PROBLEM if done.check.result == "FAILED" else EXIT_OK


def cmd_verify_attestation(args: argparse.Namespace) -> int:
    """Check an attestation's signature and, with --store, its subject; exit 1 naming each
    part that fails."""
    url = getattr(args, "store", None)
    if url:
        with open_store(args) as store:
            report = porcelain.verify_attestation(args.file, args.pub, store)
    else:
        report = porcelain.verify_attestation(args.file, args.pub)
    where = (
        f"; subject {report.subject} {report.subject_id[:12]} verified again in {url}"
        if report.checked_store
        else "; no --store: the subject was not checked"
    )
    if report.ok:
        lines = [f"attestation {args.file}: ok ({report.result}, keyid {report.keyid}{where})"]
    else:
        lines = [f"attestation {args.file}: {len(report.problems)} problem(s)"]
        lines += [f"  {p.message}" for p in report.problems]
        lines += [f"  store: {m}" for m in report.messages]
    emit(args, to_builtins(report), lines)
    return EXIT_OK if report.ok else EXIT_PROBLEM


def cmd_verify_reveal(args: argparse.Namespace) -> int:
    """Check a reveal's openings against the published commitment; exit 1 naming each
    part that fails."""
    with open_store(args) as store:
        report = porcelain.verify_reveal(store, args.file, commitment=args.commitment)
    head = f"reveal {args.file}: commitment {report.commitment[:12]} of {report.set}"
    if report.ok:
        lines = [f"{head}: ok, {report.opened} openings open root {report.root[:16]}"]
    else:
        lines = [
            f"{head}: {len(report.problems)} problem(s), {report.opened} of "
            f"{report.openings} openings open root {report.root[:16]}"
        ]
        lines += [f"  {p.message}" for p in report.problems]
    emit(args, to_builtins(report), lines)
    return EXIT_OK if report.ok else EXIT_PROBLEM


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``audit`` and its verbs to the top-level subcommands."""
    p = groups.add_parser(
        "audit",
        help="provenance, verification, diff and PROV export of results",
        parents=[common_options()],
    )
    p.set_defaults(handler=None, parser=p)
    verbs = p.add_subparsers(title="verbs", metavar="VERB")

    v = add_command(verbs, "show", cmd_show, "show where a result came from")
    v.add_argument("result", metavar="RESULT", help=_RESULT)
    v.add_argument("--runs", action="store_true", help="list every run of every job")

    v = add_command(
        verbs, "verify", cmd_verify, "re-hash a result's closure and compute its score again"
    )
    v.add_argument("result", metavar="RESULT", help=_RESULT)
    v.add_argument(
        "--canonical",
        action="store_true",
        help="also check each object is in canonical form (slower, what cas fsck does)",
    )
    add_jobs_option(v)

    v = add_command(verbs, "diff", cmd_diff, "name the inputs that differ between two results")
    v.add_argument("a", metavar="A", help=_RESULT)
    v.add_argument("b", metavar="B", help=_RESULT)
    v.add_argument(
        "--limit",
        type=int,
        default=50,
        metavar="N",
        help="per-patient lines per pair and kind before the rest are counted (default 50)",
    )
    v.add_argument("--all", action="store_true", help="every per-patient line, no limit")

    v = add_command(verbs, "export", cmd_export, "write a result's provenance as PROV-JSON")
    v.add_argument("result", metavar="RESULT", help=_RESULT)
    v.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    v.add_argument(
        "--max-items",
        type=int,
        default=10_000,
        metavar="N",
        help="atom tasks and runs listed one by one up to N, summarised beyond (default 10000)",
    )

    v = add_command(
        verbs, "attest", cmd_attest, "verify a result and sign an in-toto statement of it"
    )
    v.add_argument("result", metavar="RESULT", help=_RESULT)
    v.add_argument(
        "--key", required=True, metavar="KEY", help="Ed25519 private key, PEM (medomni keygen)"
    )
    v.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="write the DSSE envelope here"
    )

    v = add_command(
        verbs,
        "verify-attestation",
        cmd_verify_attestation,
        "check an attestation's signature and, with --store, its subject",
    )
    v.add_argument("file", metavar="FILE", help="a DSSE envelope (audit attest -o)")
    v.add_argument(
        "--pub", required=True, metavar="KEY", help="the signer's Ed25519 public key, PEM"
    )

    v = add_command(
        verbs,
        "verify-reveal",
        cmd_verify_reveal,
        "check revealed answers against a set's published answer commitment",
    )
    v.add_argument("file", metavar="FILE", help="a reveal (studio taskset reveal -o)")
    v.add_argument(
        "--commitment",
        metavar="ID",
        help="the published commitment: an id, prefix or ref (default: the file's, which "
        "must be in the store)",
    )
