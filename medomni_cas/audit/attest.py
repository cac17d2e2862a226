"""Sign a statement about a result, and check a signed one, offline, with standard formats.

`attest` verifies the subject (as ``medomni audit verify`` does), makes its in-toto
Statement (`medomni_cas.audit.statement`), signs it in a DSSE envelope with an Ed25519 key
(`medomni_cas.audit.dsse`), stores the envelope as an `Attestation` linking the subject and
moves ``attestations/<set>/<keyid>`` to it (so it travels with push, pull and bundles, and
``audit show`` lists it).

`verify_attestation` checks an envelope, naming the part that fails:

* ``envelope`` / ``payloadType`` / ``statement``: not a DSSE envelope of an in-toto
  Statement v1 (with the predicate type the subject's kind is attested with);
* ``key``: the envelope is not signed by the key given (another keyid);
* ``signature``: the key's signature does not verify over the PAE (a payload byte, the
  payload type or the signature changed);

and, with a store:

* ``subject``: the subject (by its blake3 digest, which is its id) is not in the store, or
  is not of the kind or name the statement says;
* ``subject digest``: its sha256 is not that of the object's canonical bytes;
* ``predicate…``: the statement made again from the store now (verifying the subject
  again: every object re-hashed, its score computed again) differs; each differing field
  is named by its path (``predicate.medomni.rows[3].value``), with both values.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from medomni_cas.audit import dsse
from medomni_cas.audit.keys import keyid as key_id
from medomni_cas.audit.records import Attestation
from medomni_cas.audit.refnames import attestation_ref
from medomni_cas.audit.statement import (
    STATEMENT_TYPE,
    SUBJECTS,
    Check,
    resolve_subject,
    statement,
    subject_kind,
)
from medomni_cas.errors import IntegrityError, InvalidId, MedomniError, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "AttestProblem",
    "AttestationInfo",
    "Attested",
    "AttestationReport",
    "attest",
    "attestation_lines",
    "attestations_of",
    "verify_attestation",
]


@dataclass(frozen=True)
class Attested:
    """What `attest` made: the envelope's bytes, the stored `Attestation` and its ref."""

    envelope: bytes
    attestation: ObjectId
    ref: str
    subject: ObjectId
    subject_name: str
    keyid: str
    check: Check


def attest(
    store: Store,
    subject: str | ObjectId,
    private: Ed25519PrivateKey,
    *,
    output: str | os.PathLike[str] | None = None,
    check: Callable[[Store, ObjectId], Check] | None = None,
) -> Attested:
    """Verify ``subject`` (a set name, ref, id or prefix), sign its statement with
    ``private``, store the attestation under ``attestations/<set>/<keyid>`` and write the
    envelope to ``output`` (when given). A subject that fails verification is attested
    too, as ``FAILED``: the signature says what was found, not that it was good."""
    oid = resolve_subject(store, subject)
    sk = subject_kind(store, oid)
    found = (check or sk.check)(store, oid)
    doc = statement(store, oid, found)
    payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")
    kid = key_id(private.public_key())
    env = dsse.sign(dsse.INTOTO_PAYLOAD_TYPE, payload, private, keyid=kid)
    data = dsse.encode(env)
    aid = store.put(
        Attestation(subject=oid, keyid=kid, predicate_type=doc["predicateType"], envelope=data)
    )
    ref = attestation_ref(sk.set_name(store, oid), kid, sk.what)
    store.refs.update(ref, lambda _old: aid, message=f"attest {sk.what} {oid.hex()[:12]}")
    if output is not None:
        Path(output).write_bytes(data)
    return Attested(data, aid, ref, oid, doc["subject"][0]["name"], kid, found)


class AttestProblem(msgspec.Struct, kw_only=True):
    """One part of an attestation that fails: ``part`` names it (``signature``, ``key``,
    ``subject digest``, ``predicate.medomni.rows[3].value``…)."""

    part: str
    message: str
    statement: Any = None  # what the signed statement says
    store: Any = None  # what the store gives


class AttestationReport(msgspec.Struct, kw_only=True):
    """What `verify_attestation` found; ``ok`` when ``problems`` is empty."""

    ok: bool
    keyid: str
    signature: bool  # the key's signature verifies over the payload
    checked_store: bool  # the subject was checked against a store
    subject: str = ""  # its name in the statement
    subject_id: str = ""
    predicate_type: str = ""
    result: str = ""  # the predicate's result, as signed
    problems: list[AttestProblem] = []
    messages: list[str] = []  # what the store's verification found behind a FAILED check


def _problem(part: str, message: str, **kw: Any) -> AttestProblem:
    return AttestProblem(part=part, message=f"{part}: {message}", **kw)


def verify_attestation(
    data: bytes, public: Ed25519PublicKey, store: Store | None = None
) -> AttestationReport:
    """Check the envelope ``data`` (its JSON bytes) against ``public`` and, with ``store``,
    against what the store holds now; see the module docstring."""
    kid = key_id(public)
    report = AttestationReport(ok=False, keyid=kid, signature=False, checked_store=False)
    try:
        env = dsse.decode(data)
    except dsse.EnvelopeError as e:
        report.problems.append(_problem(e.part, str(e).split(": ", 1)[1]))
        return report
    for msg in dsse.verify(env, public):
        part, _, text = msg.partition(": ")
        report.problems.append(_problem(part, text))
    report.signature = not report.problems
    doc = _statement_of(env, report)
    if doc is None:
        report.ok = False
        return report
    subj = doc["subject"][0]
    report.subject = str(subj.get("name", ""))
    report.predicate_type = str(doc.get("predicateType", ""))
    pred = doc.get("predicate")
    report.result = str(pred.get("result", "")) if isinstance(pred, dict) else ""
    if store is not None and report.signature:
        _check_store(store, doc, report)
    report.ok = not report.problems
    return report


def _statement_of(env: dsse.Envelope, report: AttestationReport) -> dict[str, Any] | None:
    """The envelope's statement, its shape checked (a problem named, else None)."""
    if env.payload_type != dsse.INTOTO_PAYLOAD_TYPE:
        report.problems.append(
            _problem("payloadType", f"{env.payload_type!r}, not {dsse.INTOTO_PAYLOAD_TYPE!r}")
        )
        return None
    try:
        doc = json.loads(env.payload)
    except (ValueError, UnicodeDecodeError) as e:
        report.problems.append(_problem("payload", f"not JSON ({e})"))
        return None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        got = doc.get("_type") if isinstance(doc, dict) else type(doc).__name__
        report.problems.append(_problem("statement", f"_type is {got!r}, not {STATEMENT_TYPE!r}"))
        return None
    subjects = doc.get("subject")
    if (
        not isinstance(subjects, list)
        or len(subjects) != 1
        or not isinstance(subjects[0], dict)
        or not isinstance(subjects[0].get("digest"), dict)
    ):
        report.problems.append(_problem("subject", "the statement must have one subject"))
        return None
    if doc.get("predicateType") not in {s.predicate_type for s in SUBJECTS.values()}:
        report.problems.append(
            _problem("predicateType", f"{doc.get('predicateType')!r} is not one attested here")
        )
        return None
    return doc


def _check_store(store: Store, doc: dict[str, Any], report: AttestationReport) -> None:
    report.checked_store = True
    subj = doc["subject"][0]
    digest = subj["digest"]
    try:
        oid = ObjectId.from_hex(str(digest.get("blake3", "")))
        data = store.get_raw(oid)
    except InvalidId:
        report.problems.append(_problem("subject digest", "no blake3 digest (the object's id)"))
        return
    except NotFound:
        report.problems.append(
            _problem(
                "subject digest",
                f"blake3 {oid.hex()} names no object in {store.url} (the subject is not "
                "there, or the digest was changed)",
            )
        )
        return
    except IntegrityError as e:
        report.problems.append(_problem("subject", f"the object in {store.url} is corrupt: {e}"))
        return
    report.subject_id = oid.hex()
    kind, _ = encoding.kind_of(data)
    if kind not in SUBJECTS:
        report.problems.append(_problem("subject", f"{oid.hex()} is a {kind} object"))
        return
    found = SUBJECTS[kind].check(store, oid)
    report.messages = list(found.messages)
    want = statement(store, oid, found)
    mine = json.loads(json.dumps(want, sort_keys=True))
    doc = _unopenable(doc, mine, report)
    diffs: list[tuple[str, Any, Any]] = []
    _diff(doc, mine, "", diffs)
    for path, theirs, ours in diffs:
        part = "subject digest" if path.startswith("subject[0].digest") else path
        report.problems.append(
            _problem(
                part,
                f"the statement says {_show(theirs)}, the store gives {_show(ours)}"
                + _row_hint(mine, path),
                statement=theirs,
                store=ours,
            )
        )


def _unopenable(
    doc: dict[str, Any], mine: dict[str, Any], report: AttestationReport
) -> dict[str, Any]:
    """The signed statement without its answer-commitment test (and descriptor) when this
    store cannot check it: it has not the set's salts (or not its commitment), which only
    the committing store keeps. Said in ``messages``; anything else must match."""
    test = "answer-commitment"
    pred, ours = doc.get("predicate"), mine.get("predicate", {})
    if not isinstance(pred, dict):
        return doc

    def tests(p: dict[str, Any]) -> set[str]:
        return {t for k in ("passedTests", "failedTests") for t in p.get(k) or ()}

    if test not in tests(pred) or test in tests(ours):
        return doc
    pred = dict(pred)
    for k in ("passedTests", "failedTests"):
        if isinstance(pred.get(k), list):
            pred[k] = [t for t in pred[k] if t != test]
    names = {c.get("name") for c in ours.get("configuration", ()) if isinstance(c, dict)}
    if isinstance(pred.get("configuration"), list):
        pred["configuration"] = [
            c
            for c in pred["configuration"]
            if not (
                isinstance(c, dict)
                and str(c.get("name", "")).startswith("studio/commitments/")
                and c.get("name") not in names
            )
        ]
    report.messages.append(
        f"{test}: not checked here (this store has not the set's answer salts, which only "
        "the committing store keeps): the signed test is taken as signed; check a reveal "
        "with audit verify-reveal"
    )
    return {**doc, "predicate": pred}


def _diff(a: Any, b: Any, path: str, out: list[tuple[str, Any, Any]]) -> None:
    """Paths at which the JSON values ``a`` (signed) and ``b`` (made again) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append((sub, None, b[k]))
            elif k not in b:
                out.append((sub, a[k], None))
            else:
                _diff(a[k], b[k], sub, out)
        return
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            sub = f"{path}[{i}]"
            if i >= len(a):
                out.append((sub, None, b[i]))
            elif i >= len(b):
                out.append((sub, a[i], None))
            else:
                _diff(a[i], b[i], sub, out)
        return
    if a != b or (type(a) is not type(b) and not _same_number(a, b)):
        out.append((path, a, b))


def _same_number(a: Any, b: Any) -> bool:
    numbers = (int, float)
    return (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


def _show(v: Any) -> str:
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def _row_hint(doc: dict[str, Any], path: str) -> str:
    """`` (agent …, arm …, pair …, target …, metric …)`` for a path inside a score row."""
    prefix = "predicate.medomni.rows["
    if not path.startswith(prefix):
        return ""
    try:
        i = int(path[len(prefix) :].split("]", 1)[0])
        r = doc["predicate"]["medomni"]["rows"][i]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    if "a" in r and "b" in r:  # a comparison's contrast row
        return (
            f" (row: agent {r.get('agent')}, {r['a']} - {r['b']}, pair {r.get('pair')}, "
            f"target {r.get('target')}, metric {r.get('metric')})"
        )
    arm = r.get("arm", "") + (f".{r['arm_variant']}" if r.get("arm_variant") else "")
    return (
        f" (row: agent {r.get('agent')}, arm {arm}, pair {r.get('pair')}, "
        f"target {r.get('target')}, metric {r.get('metric')})"
    )


class AttestationInfo(msgspec.Struct, kw_only=True):
    """One stored attestation of a subject, for listing (``audit show``)."""

    ref: str
    id: str
    keyid: str
    predicate_type: str
    result: str  # the predicate's result, as signed


def attestations_of(store: Store, subject: ObjectId) -> list[AttestationInfo]:
    """The attestations of ``subject`` the store's ``attestations/`` refs point at."""
    from medomni_cas.audit.refnames import ATTESTATION_REFS

    out = []
    for ref, aid in sorted(store.refs.items(ATTESTATION_REFS)):
        try:
            att = store.get(aid, Attestation)
        except MedomniError:  # a damaged or foreign object: fsck's to name
            continue
        if att.subject != subject:
            continue
        try:
            doc = json.loads(dsse.decode(att.envelope).payload)
            result = str(doc["predicate"]["result"])
        except (dsse.EnvelopeError, ValueError, KeyError, TypeError):
            result = "?"
        out.append(
            AttestationInfo(
                ref=ref,
                id=aid.hex(),
                keyid=att.keyid,
                predicate_type=att.predicate_type,
                result=result,
            )
        )
    return out


def attestation_lines(signed: list[AttestationInfo]) -> list[str]:
    """``audit show``'s lines for a subject's attestations (none: no lines)."""
    if not signed:
        return []
    return [f"  attestations ({len(signed)})"] + [
        f"    {a.ref}  {a.id[:12]}  {a.result}" for a in signed
    ]
