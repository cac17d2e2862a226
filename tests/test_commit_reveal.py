"""Commit-then-reveal answer keys: the Merkle scheme, commit, reveal, verify-reveal, audit
verify of a result whose answers do not open the commitment, and what a bundle holds.

Uses the session's small flow (`tests._attest_flow`); every test that commits works on a
copy of its store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.audit.attest import attest
from medomni_cas.audit.keys import generate
from medomni_cas.audit.verify import verify_result
from medomni_cas.bench.records import Result
from medomni_cas.cli import main
from medomni_cas.store.bundle import import_bundle, read_bundle_header
from medomni_cas.store.sync import push
from medomni_cas.studio import merkle
from medomni_cas.studio.commitments import (
    AnswerCommitment,
    AnswerSalts,
    Leaf,
    commit,
    make_commitment,
    set_answers,
)
from medomni_cas.studio.refnames import answer_salts_ref, commitment_ref
from medomni_cas.studio.reveal import reveal, verify_reveal
from medomni_cas.studio.tasksets import publish
from tests._attest_flow import SET, Flow, attest_flow


# -- the Merkle scheme ----------------------------------------------------------------------------
def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1's Merkle Tree Hash, as the RFC writes it (recursive)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return merkle.node_hash(_mth(leaves[:k]), _mth(leaves[k:]))


def _path(m: int, leaves: list[bytes]) -> list[bytes]:
    """RFC 6962 §2.1.1's audit path PATH(m, D[n]), as the RFC writes it."""
    if len(leaves) <= 1:
        return []
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    if m < k:
        return [*_path(m, leaves[:k]), _mth(leaves[k:])]
    return [*_path(m - k, leaves[k:]), _mth(leaves[:k])]


def test_the_tree_is_rfc_6962s_for_every_size_up_to_40() -> None:
    for n in range(0, 41):
        leaves = [merkle.leaf_hash(b"%d" % i) for i in range(n)]
        root = merkle.root(leaves)
        assert root == _mth(leaves), n
        if not n:
            continue
        tree = merkle.levels(leaves)
        for m in range(n):
            proof = merkle.inclusion_proof(tree, m)
            assert proof == _path(m, leaves), (n, m)
            assert merkle.root_from_proof(m, n, leaves[m], proof) == root
            for step in range(len(proof)):  # every proof step matters
                bad = list(proof)
                bad[step] = bytes(32)
                assert merkle.root_from_proof(m, n, leaves[m], bad) != root
            assert merkle.root_from_proof(m, n, leaves[m], [*proof, bytes(32)]) != root
            if proof:
                assert merkle.root_from_proof(m, n, leaves[m], proof[:-1]) != root
        assert merkle.root_from_proof(n, n, leaves[0], []) is None


def _leaves(n: int) -> list[Leaf]:
    answers: list[str | float | None] = ["G1", "G2", 3.5, None]
    return [
        Leaf(mc.ObjectId(bytes([i]) * 32), "t", answers[i % 4], "p", "a", str(i)) for i in range(n)
    ]


def test_same_answers_and_salts_give_the_same_root_new_salts_another() -> None:
    ts, sb = mc.ObjectId(bytes(32)), mc.ObjectId(b"\x01" * 32)
    first, salted = make_commitment("b/s", ts, sb, _leaves(7))
    salts = {(bytes(s.atom), s.target): s.salt for s in salted}
    again, _ = make_commitment("b/s", ts, sb, _leaves(7), salts)
    assert again == first
    fresh, resalted = make_commitment("b/s", ts, sb, _leaves(7))
    assert fresh.root != first.root and fresh.leaves == first.leaves == 7
    assert all(len(s.salt) == 32 for s in resalted)
    assert {s.salt for s in salted}.isdisjoint({s.salt for s in resalted})
    # one answer changed, same salts: another root
    changed = _leaves(7)
    changed[3] = Leaf(changed[3].atom, "t", "G4", "p", "a", "3")
    assert make_commitment("b/s", ts, sb, changed, salts)[0].root != first.root


# -- on a copy of the flow's store ----------------------------------------------------------------
@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    return attest_flow(tmp_path_factory)


@pytest.fixture
def copy(flow: Flow, tmp_path: Path) -> Iterator[tuple[str, mc.Store]]:
    url = f"lmdb://{tmp_path}/copy"
    with mc.open(flow.url, create=False) as src, mc.open(url) as dst:
        push(src, dst)
        yield url, dst


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_commit_reveal_and_verify_through_the_cli(
    flow: Flow,
    copy: tuple[str, mc.Store],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, store = copy
    code, out, _ = _run(capsys, "--json", "studio", "taskset", "commit", SET, "--store", url)
    assert code == 0
    made = json.loads(out)
    assert made["new"] and made["leaves"] == 20  # 20 atoms, one target
    cid = store.refs.get(commitment_ref(SET))
    assert cid is not None and cid.hex() == made["commitment"]
    salts = store.get(store.refs.get(answer_salts_ref(SET)) or cid, AnswerSalts)
    assert salts.commitment == cid and len(salts.leaves) == 20
    # committing again keeps the commitment: the published root must keep opening
    code, out, _ = _run(capsys, "--json", "studio", "taskset", "commit", SET, "--store", url)
    assert code == 0 and not json.loads(out)["new"] and json.loads(out)["commitment"] == cid.hex()

    rev = tmp_path / "reveal.json"
    studio = str(flow.root / "studio")
    argv = ["studio", "taskset", "reveal", SET, "-o", str(rev), "--store", url]
    # a set of credentialed data is revealed only when asked for exactly that
    cred = tmp_path / "cred-studio"
    shutil.copytree(flow.root / "studio", cred, ignore=shutil.ignore_patterns("data"))
    card = cred / "datasets/synth-ehr/dataset.yaml"
    card.write_text(card.read_text().replace("credentialed: false", "credentialed: true"))
    code, _, err = _run(capsys, *argv, "--studio", str(cred))
    assert code == 2 and "--reveal-credentialed" in err and not rev.exists()
    assert _run(capsys, *argv, "--studio", str(cred), "--reveal-credentialed")[0] == 0
    assert _run(capsys, *argv, "--studio", studio)[0] == 0
    doc = json.loads(rev.read_text())
    assert len(doc["openings"]) == 20 and doc["root"] == store.get(cid, AnswerCommitment).root
    code, out, _ = _run(capsys, "audit", "verify-reveal", str(rev), "--store", url)
    assert code == 0 and "20 openings open root" in out
    one = doc["openings"][5]["atom"][:10]
    assert _run(capsys, *argv, "--studio", studio, "--atoms", one)[0] == 0
    assert [o["atom"][:10] for o in json.loads(rev.read_text())["openings"]] == [one]
    assert _run(capsys, *argv, "--studio", studio, "--atoms", "00000000")[0] == 2

    # audit verify opens it, and an attestation says so
    report = verify_result(store, store.resolve(flow.result), derived=True)
    assert report.ok and report.commitment == cid.hex()
    code, out, _ = _run(capsys, "audit", "verify", SET, "--store", url)
    assert code == 0 and f"open answer commitment {cid.hex()[:12]}" in out
    done_key = generate()
    done = attest(store, flow.result, done_key)
    pred = json.loads(_payload(done.envelope))
    assert "answer-commitment" in pred["predicate"]["passedTests"]
    assert f"studio/commitments/{SET}" in [c["name"] for c in pred["predicate"]["configuration"]]
    # a store that got the attestation alone has not the salts: that test is said to be
    # unchecked, everything else is re-derived
    from medomni_cas.audit.attest import verify_attestation

    with mc.open(f"lmdb://{tmp_path}/elsewhere") as elsewhere:
        push(store, elsewhere, [done.ref])
        assert elsewhere.refs.get(answer_salts_ref(SET)) is None
        checked = verify_attestation(done.envelope, done_key.public_key(), elsewhere)
        assert checked.ok and any("answer-commitment: not checked" in m for m in checked.messages)


def _payload(envelope: bytes) -> str:
    import base64

    return base64.b64decode(json.loads(envelope)["payload"]).decode()


def _tampered(doc: dict[str, Any], change: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    change(out)
    return out


def _flip_hex(text: str) -> str:
    return ("0" if text[0] != "0" else "1") + text[1:]


def test_every_tampered_part_of_a_reveal_is_refused_by_name(
    flow: Flow, copy: tuple[str, mc.Store], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, store = copy
    done = commit(store, SET)
    doc = reveal(store, SET, studio=flow.root / "studio")
    com = store.get(done.commitment, AnswerCommitment)
    assert verify_reveal(doc, com, done.commitment).ok
    op = doc["openings"][3]
    other = next(a for a in ("G1", "G2", "G3a", "G4", "G5") if a != op["answer"])

    def at(field: str, value: Any) -> Any:
        return lambda d: d["openings"][3].__setitem__(field, value)

    cases = {
        "a leaf": (at("leaf", _flip_hex(op["leaf"])), "leaf"),
        "a salt": (at("salt", _flip_hex(op["salt"])), "answer/salt"),
        "an answer": (at("answer", other), "answer/salt"),
        "a proof step": (at("proof", [_flip_hex(op["proof"][0]), *op["proof"][1:]]), "proof"),
        "the proof's length": (at("proof", op["proof"][:-1]), "proof"),
        "a salt's form": (at("salt", op["salt"][:10]), "salt"),
        "the root": (lambda d: d.__setitem__("root", _flip_hex(d["root"])), "root"),
    }
    for what, (change, part) in cases.items():
        report = verify_reveal(_tampered(doc, change), com, done.commitment)
        assert not report.ok, what
        assert [p.part for p in report.problems] == [part], (what, report.problems)
        if part != "root":
            assert (
                report.problems[0].atom == op["atom"] and report.problems[0].target == "ckd_stage"
            )
            assert report.opened == len(doc["openings"]) - 1
    # another leaf's index: no path from this leaf to the root, and two openings of one leaf
    report = verify_reveal(
        _tampered(doc, at("index", doc["openings"][4]["index"])), com, done.commitment
    )
    assert [p.part for p in report.problems] == ["proof", "index"]
    assert "opened twice" in report.problems[1].message
    # a published root that is not the one the openings were made for: none opens it
    forged, _ = make_commitment(
        SET,
        com.task_set,
        mc.ObjectId.from_hex(com.set_build),
        set_answers(store, store.resolve(com.set_build)),
    )
    fid = store.put(forged)
    report = verify_reveal(doc, forged, fid)
    assert {p.part for p in report.problems} == {"commitment", "root", "proof"}
    assert report.opened == 0
    # the CLI: exit 1 naming the part, exit 2 for a commitment the store does not have
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_tampered(doc, cases["a leaf"][0])))
    code, out, _ = _run(capsys, "audit", "verify-reveal", str(bad), "--store", url)
    assert code == 1 and "leaf:" in out and op["atom"][:12] in out
    code, out, _ = _run(
        capsys, "audit", "verify-reveal", str(bad), "--commitment", fid.hex(), "--store", url
    )
    assert code == 1 and "root:" in out
    with mc.open(f"lmdb://{tmp_path}/empty") as _empty:
        pass
    code, _, err = _run(
        capsys, "audit", "verify-reveal", str(bad), "--store", f"lmdb://{tmp_path}/empty"
    )
    assert code == 2 and "not in" in err


def test_answer_keys_that_do_not_open_the_commitment_fail_audit_verify(
    flow: Flow, copy: tuple[str, mc.Store], capsys: pytest.CaptureFixture[str]
) -> None:
    url, store = copy
    rid = store.resolve(flow.result)
    res = store.get(rid, Result)
    leaves = set_answers(store, res.set_build)
    # the owner published a commitment to other answers than those the result scored with
    changed = leaves[7]
    other = next(a for a in ("G1", "G2", "G3a", "G4", "G5") if a != changed.answer)
    leaves[7] = Leaf(
        changed.atom, changed.target, other, changed.pair, changed.arm, changed.patient
    )
    rec, salted = make_commitment(SET, res.task_set, res.set_build, leaves)
    cid = store.put(rec)
    sid = store.put(AnswerSalts(commitment=cid, set_build=res.set_build, leaves=tuple(salted)))
    store.refs.set(answer_salts_ref(SET), sid)
    store.refs.set(commitment_ref(SET), cid)
    report = verify_result(store, rid, derived=True)
    assert not report.ok and len(report.unopened) == 1
    (msg,) = report.unopened
    assert f"atom {changed.atom.hex()[:12]}" in msg and "target ckd_stage" in msg
    assert f"patient {changed.patient}" in msg
    code, out, _ = _run(capsys, "audit", "verify", SET, "--store", url)
    assert code == 1 and f"commitment: pair {changed.pair}" in out
    done = attest(store, rid, generate())
    assert done.check.result == "FAILED" and done.check.failed == ("answer-commitment",)
    # salts that do not build the published root are named as such
    store.refs.set(
        answer_salts_ref(SET),
        store.put(msgspec.structs.replace(store.get(sid, AnswerSalts), leaves=tuple(salted[:-1]))),
    )
    (msg,) = verify_result(store, rid, derived=True).unopened
    assert "do not build its root" in msg


def test_no_answer_or_salt_leaves_in_a_commitment_or_a_configs_only_bundle(
    flow: Flow, copy: tuple[str, mc.Store], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, store = copy
    done = commit(store, SET)
    salts = store.get(store.refs.get(answer_salts_ref(SET)) or done.commitment, AnswerSalts)
    answers = {leaf.answer for leaf in set_answers(store, salts.set_build)}
    secrets = [s.salt for s in salts.leaves] + [s.salt.hex().encode() for s in salts.leaves]
    com_bytes = store.get_raw(done.commitment)
    assert store.closure(done.commitment) == {done.commitment, done.record.task_set}
    for a in answers:
        assert isinstance(a, str) and a.encode() not in com_bytes, a
    for s in secrets:
        assert s not in com_bytes
    bundle = tmp_path / "v.bundle"
    info = publish(store, SET, bundle, studio=flow.root / "studio", bench=flow.root / "bench")
    header = read_bundle_header(bundle)
    assert header.manifest["commitment"] == done.commitment.hex()
    assert header.manifest["holds"] == "configs-only" and info.objects > 0
    data = bundle.read_bytes()
    assert store.get_raw(done.commitment) in data
    for s in secrets:
        assert s not in data
    for kind in (b"medomni.answer-salts", b"medomni.answer-key", b"medomni.content"):
        assert kind not in data
    # anyone with the bundle checks a reveal against the published root, offline
    rev = tmp_path / "rev.json"
    rev.write_text(json.dumps(reveal(store, SET, studio=flow.root / "studio")))
    theirs = f"lmdb://{tmp_path}/theirs"
    with mc.open(theirs) as other:
        import_bundle(other, bundle)
        assert other.refs.get(commitment_ref(SET)) == done.commitment
    assert _run(capsys, "audit", "verify-reveal", str(rev), "--store", theirs)[0] == 0
    # --no-commitment leaves it out
    code, _, _ = _run(
        capsys, "studio", "taskset", "publish", SET, "-o", str(tmp_path / "n.bundle"),
        "--no-commitment", "--store", url, "--studio", str(flow.root / "studio"),
        "--bench", str(flow.root / "bench"),
    )  # fmt: skip
    assert code == 0
    assert "commitment" not in read_bundle_header(tmp_path / "n.bundle").manifest
    assert store.get_raw(done.commitment) not in (tmp_path / "n.bundle").read_bytes()
    assert os.path.getsize(tmp_path / "n.bundle") < os.path.getsize(bundle)


def test_a_commitment_is_attested_on_its_own(copy: tuple[str, mc.Store]) -> None:
    from medomni_cas.audit import dsse
    from medomni_cas.audit.attest import verify_attestation
    from medomni_cas.audit.keys import keyid

    _, store = copy
    done = commit(store, SET)
    key = generate()
    att = attest(store, commitment_ref(SET), key)
    assert att.subject == done.commitment and att.subject_name == f"commitments/{SET}"
    assert att.ref == f"attestations/{SET}/commitment/{keyid(key.public_key())}"
    statement = json.loads(_payload(att.envelope))
    assert statement["predicate"]["root"] == done.record.root
    assert statement["predicate"]["passedTests"] == ["commitment", "salts"]
    assert verify_attestation(att.envelope, key.public_key(), store).ok
    statement["predicate"]["root"] = "00" * 32
    lie = dsse.encode(dsse.sign(dsse.INTOTO_PAYLOAD_TYPE, json.dumps(statement).encode(), key))
    report = verify_attestation(lie, key.public_key(), store)
    assert [p.part for p in report.problems] == ["predicate.root"]
