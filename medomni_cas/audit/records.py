"""The store records the audit writes: signed attestations.

Kind names start with ``medomni.`` and are forever once released (golden vector in
``tests/test_attest_identity.py``).
"""

from __future__ import annotations

from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId

__all__ = ["Attestation"]


class Attestation(Record, frozen=True, kw_only=True):
    """A DSSE envelope, as written, over an in-toto Statement about ``subject``.

    ``envelope`` holds the envelope's JSON bytes exactly as signed and written (the file
    ``audit attest -o`` writes is these bytes), so that the object can be checked again by
    any DSSE implementation. ``subject`` links what the statement is about (a result, a
    comparison, an answer commitment), so an attestation travels with its subject's
    closure; ``keyid`` and ``predicate_type`` repeat what the envelope says, for listing
    without parsing it; a verifier reads the envelope itself."""

    __kind__ = "medomni.attestation"

    subject: ObjectId
    keyid: str
    predicate_type: str
    envelope: bytes
