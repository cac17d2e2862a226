"""Signed attestations of results: attest, verify-attestation, keygen, and every part
tampered with.

One small flow per session (`tests._attest_flow`: one pair, one arm, the baseline agent,
scored); tests that change more than its attestations work on copies.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import medomni_cas as mc
from medomni_cas.audit import dsse
from medomni_cas.audit.attest import attest, attestations_of, verify_attestation
from medomni_cas.audit.keys import generate, keyid, load_private, load_public
from medomni_cas.audit.records import Attestation
from medomni_cas.bench.records import Result
from medomni_cas.cli import main
from medomni_cas.store.bundle import export_bundle, import_bundle
from medomni_cas.store.sync import push
from tests._attest_flow import PAIR, SET, Flow, attest_flow


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    return attest_flow(tmp_path_factory)


@pytest.fixture
def store(flow: Flow) -> Iterator[mc.Store]:
    with mc.open(flow.url, create=False) as s:
        yield s


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "signer"
    assert main(["keygen", "-o", str(path)]) == 0
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _ref(store: mc.Store, name: str) -> mc.ObjectId:
    oid = store.refs.get(name)
    assert oid is not None, name
    return oid


def _resign(data: bytes, key: Path, change: Any) -> bytes:
    """The envelope ``data`` with its statement changed by ``change`` and signed again by
    ``key`` (as a signer who attests something untrue would)."""
    doc = json.loads(dsse.decode(data).payload)
    change(doc)
    payload = json.dumps(doc, sort_keys=True).encode()
    return dsse.encode(dsse.sign(dsse.INTOTO_PAYLOAD_TYPE, payload, load_private(key)))


def test_keygen_writes_a_private_file_only_its_owner_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "k"
    code, out, _ = _run(capsys, "keygen", "-o", str(path))
    assert code == 0
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    pub = path.with_name("k.pub").read_bytes()
    assert pub.startswith(b"-----BEGIN PUBLIC KEY-----")
    kid = keyid(load_public(path.with_name("k.pub")))
    assert kid in out and kid == keyid(load_private(path).public_key())
    before = path.read_bytes()
    code, _, err = _run(capsys, "keygen", "-o", str(path))
    assert code == 2 and f"{path} exists" in err and path.read_bytes() == before
    assert _run(capsys, "keygen", "-o", str(path), "--force")[0] == 0
    assert path.read_bytes() != before and os.stat(path).st_mode & 0o777 == 0o600


def test_attest_then_verify(
    flow: Flow, key: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "result.intoto.json"
    code, out, err = _run(
        capsys, "audit", "attest", SET, "--key", str(key), "-o", str(out_file), "--store", flow.url
    )
    assert code == 0, err
    assert "PASSED" in out
    env = json.loads(out_file.read_bytes())
    assert env["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(env["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    (subject,) = statement["subject"]
    assert subject["name"] == f"results/{SET}"
    assert subject["digest"]["blake3"] == flow.result
    pred = statement["predicate"]
    assert pred["result"] == "PASSED" and not pred["failedTests"]
    names = [c["name"] for c in pred["configuration"]]
    assert f"tasksets/{SET}" in names and "agents/baseline" in names
    assert f"configs/{PAIR}/no-perception" in names and "scorer/medomni-scorer" in names
    with mc.open(flow.url, create=False) as store:
        res = store.get(flow.result, Result)
        assert [r["value"] for r in pred["medomni"]["rows"]] == [r.value for r in res.rows]
        kid = keyid(load_public(key.with_name("signer.pub")))
        ref = f"attestations/{SET}/{kid}"
        att = store.get(_ref(store, ref), Attestation)
        assert att.envelope == out_file.read_bytes() and att.subject.hex() == flow.result
        listed = attestations_of(store, store.resolve(flow.result))
        assert [(a.ref, a.result) for a in listed] == [(ref, "PASSED")]
    pub = str(key.with_name("signer.pub"))
    code, out, _ = _run(capsys, "audit", "verify-attestation", str(out_file), "--pub", pub)
    assert code == 0 and "no --store" in out
    code, out, _ = _run(
        capsys, "audit", "verify-attestation", str(out_file), "--pub", pub, "--store", flow.url
    )
    assert code == 0 and "verified again" in out
    code, out, _ = _run(capsys, "audit", "show", SET, "--store", flow.url)
    assert code == 0 and ref in out
    # a missing envelope file is bad input
    missing = str(tmp_path / "nope.json")
    assert _run(capsys, "audit", "verify-attestation", missing, "--pub", pub)[0] == 2


@pytest.fixture(scope="module")
def signed(flow: Flow, key: Path) -> bytes:
    with mc.open(flow.url, create=False) as store:
        return attest(store, flow.result, load_private(key)).envelope


def _flip_payload(data: bytes) -> bytes:
    doc = json.loads(data)
    raw = bytearray(base64.b64decode(doc["payload"]))
    raw[raw.index(b'"PASSED"') + 1] ^= 0x20  # PASSED -> pASSED
    doc["payload"] = base64.b64encode(bytes(raw)).decode()
    return json.dumps(doc).encode()


def _flip_signature(data: bytes) -> bytes:
    doc = json.loads(data)
    sig = bytearray(base64.b64decode(doc["signatures"][0]["sig"]))
    sig[5] ^= 0x01
    doc["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    return json.dumps(doc).encode()


def _set_score(doc: dict[str, Any]) -> None:
    doc["predicate"]["medomni"]["rows"][0]["value"] = 0.99


def _set_digest(doc: dict[str, Any]) -> None:
    doc["subject"][0]["digest"]["sha256"] = "00" * 32


def _set_blake3(doc: dict[str, Any]) -> None:
    doc["subject"][0]["digest"]["blake3"] = "00" * 32


def test_every_tampered_part_is_refused_by_name(
    flow: Flow, key: Path, signed: bytes, store: mc.Store
) -> None:
    pub = load_public(key.with_name("signer.pub"))
    assert verify_attestation(signed, pub, store).ok
    cases = {
        "payload byte": (_flip_payload(signed), "signature"),
        "signature": (_flip_signature(signed), "signature"),
        "key": (signed, "key"),
        "subject digest (sha256)": (_resign(signed, key, _set_digest), "subject digest"),
        "subject digest (blake3)": (_resign(signed, key, _set_blake3), "subject digest"),
        "a score": (_resign(signed, key, _set_score), "predicate.medomni.rows[0].value"),
    }
    other = generate().public_key()
    for what, (data, part) in cases.items():
        report = verify_attestation(data, other if what == "key" else pub, store)
        assert not report.ok, what
        assert [p.part for p in report.problems] == [part], (what, report.problems)
    score = verify_attestation(cases["a score"][0], pub, store).problems[0]
    assert score.statement == 0.99 and "pair synth-ehr_ckd-staging@n20" in score.message
    # without a store only the envelope can be checked: a re-signed lie passes it
    assert verify_attestation(cases["a score"][0], pub).ok


def test_verify_attestation_exit_codes(
    flow: Flow, key: Path, signed: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pub = str(key.with_name("signer.pub"))
    bad = tmp_path / "bad.json"
    bad.write_bytes(_resign(signed, key, _set_score))
    code, out, _ = _run(
        capsys, "--json", "audit", "verify-attestation", str(bad), "--pub", pub, "--store", flow.url
    )
    assert code == 1
    assert json.loads(out)["problems"][0]["part"] == "predicate.medomni.rows[0].value"
    bad.write_bytes(_flip_signature(signed))
    code, out, _ = _run(capsys, "audit", "verify-attestation", str(bad), "--pub", pub)
    assert code == 1 and "signature:" in out
    code, _, err = _run(capsys, "audit", "verify-attestation", str(bad), "--pub", str(bad))
    assert code == 2 and "not a PEM public key" in err


def test_a_forged_result_is_attested_as_failed(
    flow: Flow, key: Path, store: mc.Store, tmp_path: Path
) -> None:
    with mc.open(f"lmdb://{tmp_path}/copy") as copy:
        push(store, copy)
        res = copy.get(flow.result, Result)
        rows = (msgspec.structs.replace(res.rows[0], value=0.99), *res.rows[1:])
        forged = copy.put(msgspec.structs.replace(res, rows=rows))
        done = attest(copy, forged, load_private(key))
        assert done.check.result == "FAILED" and "score" in done.check.failed
        assert any("recorded 0.99" in m for m in done.check.messages)
        # it says what it found, and the store agrees: the attestation verifies
        pub = load_public(key.with_name("signer.pub"))
        assert verify_attestation(done.envelope, pub, copy).ok


def test_attestations_travel_with_push_and_bundles(
    flow: Flow, key: Path, signed: bytes, store: mc.Store, tmp_path: Path
) -> None:
    kid = keyid(load_public(key.with_name("signer.pub")))
    ref = f"attestations/{SET}/{kid}"
    pub = load_public(key.with_name("signer.pub"))
    with mc.open(f"file://{tmp_path}/remote") as remote:
        push(store, remote, [ref])
        att = remote.get(_ref(remote, ref), Attestation)
        assert verify_attestation(att.envelope, pub, remote).ok  # the subject came along
    bundle = tmp_path / "att.bundle"
    export_bundle(store, [], bundle, refs={ref: _ref(store, ref)})
    with mc.open(f"lmdb://{tmp_path}/other") as other:
        import_bundle(other, bundle)
        att = other.get(_ref(other, ref), Attestation)
        assert verify_attestation(att.envelope, pub, other).ok
