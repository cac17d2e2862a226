"""DSSE envelopes (Dead Simple Signing Envelope v1) signed with Ed25519.

The envelope is the JSON object the DSSE spec defines::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": "<base64 of the payload bytes>",
     "signatures": [{"keyid": "<keyid>", "sig": "<base64 of the signature>"}]}

A signature is Ed25519 over the pre-authentication encoding (`pae`), never over the payload
alone, so the payload type is signed too::

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

with ``LEN`` the length in bytes as ASCII decimal, no leading zeros. Base64 is the standard
alphabet with padding (the spec's readers accept URL-safe too; so does `decode`). This is
the envelope securesystemslib and the in-toto tools read and write (the interop test checks
both ways).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from medomni_cas._extras import require
from medomni_cas.audit.keys import keyid as key_id
from medomni_cas.errors import MedomniError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "INTOTO_PAYLOAD_TYPE",
    "Envelope",
    "EnvelopeError",
    "Signature",
    "decode",
    "encode",
    "pae",
    "sign",
    "verify",
]

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


class EnvelopeError(MedomniError, ValueError):
    """An envelope that is not a DSSE envelope; ``part`` names what is wrong with it."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(f"{part}: {message}")
        self.part = part


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding of ``payload_type`` and ``payload``."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign(
    payload_type: str, payload: bytes, private: Ed25519PrivateKey, *, keyid: str | None = None
) -> Envelope:
    """An envelope of ``payload`` with one Ed25519 signature over its PAE."""
    kid = key_id(private.public_key()) if keyid is None else keyid
    sig = private.sign(pae(payload_type, payload))
    return Envelope(payload_type, payload, (Signature(kid, sig),))


def encode(env: Envelope) -> bytes:
    """The envelope as JSON bytes (key order as in the spec's examples, one line)."""
    doc = {
        "payloadType": env.payload_type,
        "payload": base64.b64encode(env.payload).decode("ascii"),
        "signatures": [
            {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
            for s in env.signatures
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8") + b"\n"


def _b64(text: object, part: str) -> bytes:
    if not isinstance(text, str):
        raise EnvelopeError(part, f"not a base64 string (a {type(text).__name__})")
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise EnvelopeError(part, f"not base64 ({e})") from None


def decode(data: bytes | str) -> Envelope:
    """An envelope from its JSON; `EnvelopeError` naming the field that is wrong."""
    try:
        doc: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise EnvelopeError("envelope", f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise EnvelopeError("envelope", "not a JSON object")
    ptype = doc.get("payloadType")
    if not isinstance(ptype, str):
        raise EnvelopeError("payloadType", "missing or not a string")
    payload = _b64(doc.get("payload"), "payload")
    sigs = doc.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise EnvelopeError("signatures", "missing or empty")
    out = []
    for i, s in enumerate(sigs):
        if not isinstance(s, dict):
            raise EnvelopeError(f"signatures[{i}]", "not a JSON object")
        kid = s.get("keyid", "")
        if not isinstance(kid, str):
            raise EnvelopeError(f"signatures[{i}].keyid", "not a string")
        out.append(Signature(kid, _b64(s.get("sig"), f"signatures[{i}].sig")))
    return Envelope(ptype, payload, tuple(out))


def verify(env: Envelope, public: Ed25519PublicKey) -> list[str]:
    """What is wrong with ``env``'s signature by ``public`` (empty: one signature of the key
    verifies over the PAE). A signature whose keyid names another key is not tried, as DSSE
    says; one with no keyid is."""
    exceptions = require("cryptography.exceptions", "attest", "signed attestations")
    kid = key_id(public)
    mine = [s for s in env.signatures if s.keyid in (kid, "")]
    if not mine:
        others = ", ".join(s.keyid or "(none)" for s in env.signatures)
        return [f"key: the envelope is signed by keyid {others}, not by the key given ({kid})"]
    message = pae(env.payload_type, env.payload)
    for s in mine:
        try:
            public.verify(s.sig, message)
            return []
        except exceptions.InvalidSignature:
            continue
    return [
        f"signature: the signature of keyid {kid} does not verify over the payload "
        "(the payload, its type or the signature was changed after signing)"
    ]
