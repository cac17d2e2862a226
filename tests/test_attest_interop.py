"""Our DSSE envelopes against implementations that are not ours.

* securesystemslib (what the in-toto tools use) verifies an envelope we signed, with its
  own Ed25519 key type, and refuses it once a payload byte changes;
* an envelope securesystemslib signed verifies with ours, and is refused by ours once
  changed;
* `cryptography` alone verifies our signature over the pre-authentication encoding as
  this test writes it from the DSSE spec (and the spec's own example PAE is ours).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from medomni_cas.audit import dsse
from medomni_cas.audit.keys import generate, keyid

pytest.importorskip("securesystemslib")
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

TYPE = dsse.INTOTO_PAYLOAD_TYPE
STATEMENT = json.dumps(
    {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "results/x/y", "digest": {"blake3": "ab" * 32}}],
        "predicateType": "https://in-toto.io/attestation/test-result/v0.1",
        "predicate": {"result": "PASSED", "configuration": []},
    },
    separators=(",", ":"),
).encode()


def _spec_pae(payload_type: str, payload: bytes) -> bytes:
    # DSSE v1, "Protocol": PAE(type, body) = "DSSEv1" + SP + LEN(type) + SP + type + SP
    # + LEN(body) + SP + body, LEN(s) = ASCII decimal byte length, no leading zeros
    t = payload_type.encode("utf-8")
    return b" ".join([b"DSSEv1", str(len(t)).encode(), t, str(len(payload)).encode(), payload])


def _flip_payload(doc: dict[str, Any]) -> dict[str, Any]:
    raw = bytearray(base64.b64decode(doc["payload"]))
    raw[len(raw) // 2] ^= 0x01
    return {**doc, "payload": base64.b64encode(bytes(raw)).decode()}


def test_the_spec_example_pae() -> None:
    # the example in the DSSE spec's protocol.md
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert dsse.pae(TYPE, STATEMENT) == _spec_pae(TYPE, STATEMENT)


def test_securesystemslib_verifies_our_envelope() -> None:
    key = generate()
    data = dsse.encode(dsse.sign(TYPE, STATEMENT, key))
    theirs = SSlibKey.from_crypto(key.public_key(), keyid=keyid(key.public_key()))
    env = SslibEnvelope.from_dict(json.loads(data))  # (from_dict changes the dict it reads)
    assert env.payload == STATEMENT and env.payload_type == TYPE
    assert list(env.verify([theirs], 1)) == [theirs.keyid]
    with pytest.raises(VerificationError):
        SslibEnvelope.from_dict(_flip_payload(json.loads(data))).verify([theirs], 1)


def test_an_envelope_securesystemslib_signed_verifies_with_ours() -> None:
    key = generate()
    kid = keyid(key.public_key())
    signer = CryptoSigner(key, SSlibKey.from_crypto(key.public_key(), keyid=kid))
    env = SslibEnvelope(payload=STATEMENT, payload_type=TYPE, signatures={})
    env.sign(signer)
    ours = dsse.decode(json.dumps(env.to_dict()))
    assert ours.payload == STATEMENT
    assert dsse.verify(ours, key.public_key()) == []
    tampered = dsse.decode(json.dumps(_flip_payload(env.to_dict())))
    (problem,) = dsse.verify(tampered, key.public_key())
    assert problem.startswith("signature:")
    (problem,) = dsse.verify(ours, generate().public_key())
    assert problem.startswith("key:")


def test_cryptography_verifies_our_signature_over_the_spec_pae() -> None:
    from cryptography.exceptions import InvalidSignature

    key = generate()
    doc = json.loads(dsse.encode(dsse.sign(TYPE, STATEMENT, key)))
    payload = base64.b64decode(doc["payload"])
    sig = base64.b64decode(doc["signatures"][0]["sig"])
    assert doc["payloadType"] == TYPE and doc["signatures"][0]["keyid"] == keyid(key.public_key())
    key.public_key().verify(sig, _spec_pae(doc["payloadType"], payload))  # raises if not
    with pytest.raises(InvalidSignature):
        key.public_key().verify(sig, payload)  # over the payload alone it is not
