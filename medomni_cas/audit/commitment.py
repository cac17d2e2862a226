"""Placeholder: filled by the commit-then-reveal increment."""

from __future__ import annotations

from typing import Any

from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["check_result_opens", "commitment_descriptor"]


def check_result_opens(store: Store, result: ObjectId) -> list[str] | None:
    return None


def commitment_descriptor(store: Store, set_name: str) -> dict[str, Any] | None:
    return None
