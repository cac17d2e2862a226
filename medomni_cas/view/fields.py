"""Any object as plain values: its fields, the links among them and a one-line name.

The viewer shows every kind of object, its own and those of plug-ins or later releases
(a kind no installed package registers is an `UnknownObject`, shown all the same): a record
becomes a dict of its fields, a tree a dict of its entries, and links stay `ObjectId`, so
the pages link them and `links` finds them with the field path that holds each.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import Tree, UnknownObject

__all__ = ["NAME_FIELDS", "describe", "links", "plain"]

#: Fields that name an object to a reader, in the order they are shown.
NAME_FIELDS = ("name", "pair", "arm", "arm_variant", "version", "run_id", "outcome", "target")


def plain(value: Any) -> Any:
    """``value`` with every struct made a dict of all its fields (those at their default
    too), trees dicts of their entries, and sequences lists; links stay `ObjectId`."""
    if isinstance(value, ObjectId):
        return value
    if isinstance(value, UnknownObject):
        return plain(value.body)
    if isinstance(value, msgspec.Struct):
        return {f: plain(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, Tree):
        return dict(value.items())
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def links(value: Any, path: str = "") -> Iterator[tuple[str, ObjectId]]:
    """``(field path, id)`` for every link in a plain value, in field order."""
    if isinstance(value, ObjectId):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from links(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from links(v, f"{path}[{i}]")


def describe(kind: str, body: Any) -> str:
    """A short name for an object: its kind and the fields that name it."""
    if not isinstance(body, dict):
        return kind
    parts = [str(body[f]) for f in NAME_FIELDS if isinstance(body.get(f), (str, int)) and body[f]]
    return f"{kind} {' '.join(parts)}".strip()
