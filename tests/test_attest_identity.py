"""Golden vectors for the record kinds of attestations and answer commitments: the same
record must keep the same id forever.

If one of these fails, a change altered the canonical bytes of a released kind: undo it, or
give the new encoding a new kind version. Never regenerate these values.
"""

from __future__ import annotations

import pytest

from medomni_cas.audit.records import Attestation
from medomni_cas.store import encoding
from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.studio.commitments import AnswerCommitment, AnswerSalts, SaltedLeaf

L = ObjectId(bytes(range(32)))
M = ObjectId(bytes(range(32, 64)))
SAMPLES: dict[str, tuple[Record, str]] = {
    "attestation": (
        Attestation(
            subject=L,
            keyid="ab" * 32,
            predicate_type="https://in-toto.io/attestation/test-result/v0.1",
            envelope=b'{"payloadType":"application/vnd.in-toto+json"}\n',
        ),
        "96bee40452a0759c95dc64c8ef05287c0ad27ecc68efbe2a9870f86d2dc80b21",
    ),
    "answer-commitment": (
        AnswerCommitment(
            set="medomni-bench/v1",
            task_set=L,
            set_build=M.hex(),
            scheme="medomni-answers/v1: rfc6962 sha256, leaves sorted by (atom, target)",
            root="cd" * 32,
            leaves=2,
        ),
        "e0f0471e4a738d7599cdd50b7171048ebb30854c04a4e9f2b7a1d2d666e79733",
    ),
    "answer-salts": (
        AnswerSalts(
            commitment=L,
            set_build=M,
            leaves=(
                SaltedLeaf(atom=L, target="ckd_stage", salt=bytes(32), leaf=bytes(range(32))),
                SaltedLeaf(atom=M, target="hba1c", salt=b"\xff" * 32, leaf=bytes(range(32, 64))),
            ),
        ),
        "47216c1a95a43ee0996766e43028523adb21da2c9dea5f7d04a6e8f154273b75",
    ),
}


def test_the_leaf_scheme_is_pinned() -> None:
    """A leaf's entry and hash for one answer of each kind: the scheme is part of every
    published commitment (its ``scheme`` string), so it never changes."""
    import hashlib

    from medomni_cas.studio.commitments import entry
    from medomni_cas.studio.merkle import leaf_hash, node_hash, root

    salt = bytes(range(32))
    e = entry("b/s", L, "t", "G3a", salt)
    assert e == (
        b"medomni.answer-leaf.v1\x00" + b"\x00" * 7 + b"\x03b/s" + L + b"\x00" * 7 + b"\x01t"
        + b"\x00" * 7 + b"\x04sG3a" + salt
    )  # fmt: skip
    assert leaf_hash(e) == hashlib.sha256(b"\x00" + e).digest()
    assert entry("b/s", L, "t", 45, salt) == entry("b/s", L, "t", 45.0, salt)
    assert entry("b/s", L, "t", 45.0, salt)[-41:-32] == b"f\x40\x46\x80\x00\x00\x00\x00\x00"
    assert entry("b/s", L, "t", None, salt)[-33:-32] == b"n"
    a, b, c = (leaf_hash(entry("b/s", L, "t", v, salt)) for v in ("x", 1.5, None))
    assert root([a, b, c]) == node_hash(node_hash(a, b), c)
    assert root([a]) == a and root([]) == hashlib.sha256(b"").digest()
    assert (
        leaf_hash(entry("b/s", L, "t", "G3a", salt)).hex()
        == "7e2ff1b2ce5acff8b126cc43644f713a00160177c45f436e004c89f09d8c3fb9"
    )


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_ids(name: str) -> None:
    record, want = SAMPLES[name]
    data = encoding.encode(record)
    assert hash_bytes(data).hex() == want
    kind, version, body = encoding.decode(data)
    assert (kind, version, body) == (type(record).__kind__, 1, record)
