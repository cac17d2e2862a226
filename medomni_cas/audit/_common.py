"""What the audit modules share: finding a result, naming things the way a user reads them."""

from __future__ import annotations

from medomni_cas.bench.records import Result
from medomni_cas.errors import MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label

__all__ = ["AuditError", "arm_label", "load_result", "resolve_result", "short", "split_pair"]

#: Hex characters an id is shown with in text (JSON always has the full id).
SHORT = 12


class AuditError(MedomniError, ValueError):
    """The object asked about is not a result (or cannot be audited as one)."""


def short(oid: ObjectId | bytes | str | None) -> str:
    if oid is None:
        return "-"
    text = oid if isinstance(oid, str) else bytes(oid).hex()
    return text[:SHORT]


def split_pair(pair: str) -> tuple[str, str]:
    """``<template>@<cohort>`` -> (template, cohort)."""
    template, _, cohort = pair.partition("@")
    return template, cohort


def resolve_result(store: Store, spec: str | ObjectId) -> ObjectId:
    """The id of ``spec`` (a full id, a unique prefix or a ref name), checked to be a result.

    Unknown names raise `NotFound` (the CLI's exit 2). The kind is read from the bytes, not
    trusted from the name, so a ref that points at something else is refused clearly.
    """
    oid = store.resolve(spec)
    kind, _ = encoding.kind_of(store.get_raw(oid))
    if kind != Result.__kind__:
        raise AuditError(f"{spec} is a {kind} object ({oid.hex()}), not a result")
    return oid


def load_result(store: Store, spec: str | ObjectId) -> tuple[ObjectId, Result]:
    oid = resolve_result(store, spec)
    return oid, store.get(oid, Result)
