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

L = ObjectId(bytes(range(32)))
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
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_ids(name: str) -> None:
    record, want = SAMPLES[name]
    data = encoding.encode(record)
    assert hash_bytes(data).hex() == want
    kind, version, body = encoding.decode(data)
    assert (kind, version, body) == (type(record).__kind__, 1, record)
