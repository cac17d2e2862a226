"""The refs the audit writes: every name under its namespace is made here.

Namespace
---------
Each prefix, what its refs point at, and who moves them::

    attestations/<set>/<keyid>            the latest `Attestation` by the key    attest.attest
                                          of the set's result
    attestations/<set>/<what>/<keyid>     the same, of another subject of the    attest.attest
                                          set: ``comparison``, ``commitment``

``<keyid>`` is the hex SHA-256 of the key's DER public key (`medomni_cas.audit.keys`).
Names on disk are forever: a store written before keeps its refs.
"""

from __future__ import annotations

__all__ = ["ATTESTATION_REFS", "attestation_ref"]

ATTESTATION_REFS = "attestations/"


def attestation_ref(set_name: str, keyid: str, what: str = "result") -> str:
    """``attestations/<set>/<keyid>`` for a result, ``attestations/<set>/<what>/<keyid>``
    for another subject."""
    middle = "" if what == "result" else f"{what}/"
    return f"{ATTESTATION_REFS}{set_name}/{middle}{keyid}"
