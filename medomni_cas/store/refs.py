"""Refs: validated hierarchical names that point at object ids, with an append-only history.

The backend supplies one atomic step (`Backend.ref_update`); everything here is built on it.
``set_if_equals`` / ``add_if_new`` / ``remove_if_equals`` return False when they lose a race,
as in Dulwich; ``set`` and ``delete`` raise `ConflictError` naming the current value, and
``update`` retries a read-modify-write for appends such as run indexes.

Every update runs the update policies of the ref's name first (`medomni_cas.store.policies`:
a refused one raises `RefPolicyRefused`), unless a person forces it (``force=True`` with a
message, recorded in the history), and logs a hash-chained `RefLogEntry`
(`medomni_cas.store.reflog`).
"""

from __future__ import annotations

import operator
import re
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import EllipsisType
from typing import TYPE_CHECKING, cast

from medomni_cas.errors import ConflictError, InvalidName, NotFound, UnsupportedOperation
from medomni_cas.store import policies
from medomni_cas.store.ids import ID_SIZE, ObjectId, parse_id
from medomni_cas.store.reflog import RefLogEntry, chained, check_history, decode_entry

if TYPE_CHECKING:
    from medomni_cas.store.store import Store

__all__ = ["RefLogEntry", "Refs", "check_ref_name", "check_ref_names"]

_COMPONENT = re.compile(r"[A-Za-z0-9_@+=-][A-Za-z0-9._@+=-]*\Z")
MAX_REF_NAME = 1024


def check_ref_name(name: object) -> str:
    """Return ``name`` if it is a valid ref name, else raise `InvalidName` saying why.

    Names are ``/``-separated components of letters, digits and ``._@+=-``; no empty
    component, none starting with ``.``, none ending in ``.lock``, no ``..``.
    """
    if not isinstance(name, str):
        raise InvalidName(f"a ref name must be a string, got {type(name).__name__}")
    if not name or len(name) > MAX_REF_NAME:
        raise InvalidName(f"ref name must be 1 to {MAX_REF_NAME} characters: {name!r}")
    for part in name.split("/"):
        if not part:
            raise InvalidName(f"ref name has an empty component: {name!r}")
        if part.endswith(".lock") or not _COMPONENT.match(part) or ".." in part:
            raise InvalidName(
                f"bad ref name component {part!r} in {name!r}: use letters, digits and ._@+=- "
                "(not starting with '.', no '..', not ending in '.lock')"
            )
    return name


# Characters of names checked in bulk: those of a component, less ".", plus "/". A name made
# of these only has no ".."-, "."- or ".lock"-problem, so it is valid when it has no empty
# component and is not too long, which `check_ref_names` tests on all names at once.
_PLAIN = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@+=-/"


def check_ref_names(names: Sequence[object]) -> None:
    """`check_ref_name` for each of ``names``, raising `InvalidName` for the first bad one.

    Names without a ``.`` (``runs/slots/<hex>``, say) are checked all at once, in a few
    passes over their concatenation; otherwise each is checked on its own.
    """
    if not names:
        return
    strings = cast("Sequence[str]", names)  # until proved: join raises TypeError if not
    try:
        joined = "/".join(strings)
    except TypeError:
        joined = ""  # not all strings: the check one by one says which
    if (
        joined  # [""] joins to ""
        and joined.isascii()
        and not joined.encode().translate(None, _PLAIN)  # only plain characters
        and not joined.startswith("/")
        and not joined.endswith("/")
        and "//" not in joined  # no empty name, no empty component
        and max(map(len, strings)) <= MAX_REF_NAME
    ):
        return
    for name in names:
        check_ref_name(name)


_not_none = partial(operator.is_not, None)
_wrap_id: Callable[[bytes], ObjectId] = partial(bytes.__new__, ObjectId)  # less the length check


def _as_ids(raws: list[bytes | None]) -> list[ObjectId | None]:
    """Ref values as ids, None staying None, their lengths checked in one pass."""
    complete = None not in raws
    values = cast("list[bytes]", raws if complete else list(filter(_not_none, raws)))
    if not set(map(len, values)) <= {ID_SIZE}:
        for raw in values:
            ObjectId(raw)  # raises InvalidId for the first of a wrong length
    if complete:
        return list(map(_wrap_id, values))  # values is raws
    return [None if raw is None else _wrap_id(raw) for raw in raws]


def _raw(value: ObjectId | str | bytes | None) -> bytes | None:
    return None if value is None else bytes(parse_id(value))


class Refs:
    """The refs of one store. Values are `ObjectId`; every update is logged."""

    def __init__(self, store: Store, *, single_writer: bool = False) -> None:
        self._store = store
        self._backend = store.backend
        self._single_writer = single_writer

    def check_writable(self) -> None:
        if not self._backend.supports_atomic_refs and not self._single_writer:
            raise UnsupportedOperation(
                f"{self._backend.url}: this filesystem offers no conditional writes, so ref "
                "updates from several writers could be lost; open the store with "
                "single_writer=True (CLI: --single-writer) if you hold the only writer"
            )

    # -- reading -------------------------------------------------------------------------------
    def get(self, name: str, default: ObjectId | None = None) -> ObjectId | None:
        raw = self._backend.ref_get(check_ref_name(name))
        return default if raw is None else ObjectId(raw)

    def get_many(self, names: Sequence[str]) -> list[ObjectId | None]:
        """What each of ``names`` points to, None where absent, in order: one backend read
        for all of them (a resume check reads one ref per run slot)."""
        if not isinstance(names, list | tuple):
            names = list(names)
        check_ref_names(names)
        return _as_ids(self._backend.ref_get_many(names))

    def get_many_by_id(self, prefix: str, ids: Sequence[bytes]) -> list[ObjectId | None]:
        """`get_many` of the names ``prefix + id.hex()``, one for each of ``ids`` (32-byte
        ids), without making the names: ``refs.get_many_by_id("runs/slots/", slots)`` is the
        resume check of a job's slots, a fifth faster than making their names for
        `get_many` (the backend makes its keys from the ids).

        The names differ only in hex digits, which are valid anywhere in a component, so
        they are all valid or all invalid: one is checked (a bad prefix raises `InvalidName`
        naming it); an id of another length raises `InvalidId`."""
        if not isinstance(ids, list | tuple):
            ids = list(ids)
        if not ids:
            return []
        if set(map(len, ids)) != {ID_SIZE}:
            for raw in ids:
                ObjectId(raw)  # raises InvalidId for the first of a wrong length
        check_ref_name(prefix + ids[0].hex())
        return _as_ids(self._backend.ref_get_prefixed(prefix, ids))

    def __getitem__(self, name: str) -> ObjectId:
        value = self.get(name)
        if value is None:
            raise NotFound("ref", name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._backend.ref_get(check_ref_name(name)) is not None

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._backend.ref_iter(""))

    def items(self, prefix: str = "") -> Iterator[tuple[str, ObjectId]]:
        for name, raw in self._backend.ref_iter(prefix):
            yield name, ObjectId(raw)

    def as_dict(self, prefix: str = "") -> dict[str, ObjectId]:
        return dict(self.items(prefix))

    def history(self, name: str) -> list[RefLogEntry]:
        """Every update of ``name``, oldest first (kept after the ref is deleted)."""
        return [decode_entry(e) for e in self._backend.ref_log(check_ref_name(name))]

    def histories(self, names: Sequence[str]) -> list[list[RefLogEntry]]:
        """`history` of each of ``names``, read together (`Backend.ref_histories`)."""
        check_ref_names(names)
        read = self._backend.ref_histories(names)
        return [[decode_entry(e) for e in raws] for raws, _ in read]

    def check_history(self, name: str) -> list[str]:
        """What is wrong with ``name`` against its history (`reflog.check_history`): its
        value must be what the last entry set, and the hash chain whole. Empty when nothing."""
        try:
            raws = self._backend.ref_log(check_ref_name(name))
            current = self._backend.ref_get(name)
        except (OSError, ValueError) as e:  # a damaged history or ref file
            return [f"ref {name}: it or its history cannot be read: {e}"]
        return check_history(name, raws, current)

    def check_histories(self, names: Sequence[str]) -> list[list[str]]:
        """`check_history` of each of ``names``, read together (`Backend.ref_histories`)."""
        try:
            check_ref_names(names)
            read = self._backend.ref_histories(names)
        except (OSError, ValueError):  # one is damaged: each read alone, to say which
            return list(map(self.check_history, names))
        return [
            check_history(name, raws, current)
            for name, (raws, current) in zip(names, read, strict=True)
        ]

    def logged_names(self) -> list[str]:
        return list(self._backend.ref_log_names())

    # -- atomic updates: False on a lost race ---------------------------------------------------
    def set_if_equals(
        self,
        name: str,
        old: ObjectId | str | bytes | None,
        new: ObjectId | str | bytes | None,
        message: str = "",
        *,
        force: bool = False,
    ) -> bool:
        """Point ``name`` at ``new`` if it points at ``old`` now (None: absent / delete).

        The policies of ``name`` run first and raise `RefPolicyRefused` to refuse; a person
        may override them with ``force=True`` and a ``message`` saying why, which the
        history records as a forced update."""
        check_ref_name(name)
        self.check_writable()
        old_raw, new_raw = _raw(old), _raw(new)
        if new_raw is not None and not self._backend.contains(new_raw):
            raise NotFound("object", new_raw.hex())
        if force:
            if not message.strip():
                raise ValueError(f"forcing an update of ref {name!r} needs a message saying why")
        elif policies.covered(name):
            policies.check(
                self._store,
                name,
                None if old_raw is None else ObjectId(old_raw),
                None if new_raw is None else ObjectId(new_raw),
            )
        entry = RefLogEntry(
            old=old_raw, new=new_raw, time=time.time(), message=message, forced=force
        )
        return self._backend.ref_update(name, old_raw, new_raw, chained(name, entry))

    def add_if_new(self, name: str, new: ObjectId | str, message: str = "") -> bool:
        """Create ``name`` only if it does not exist."""
        return self.set_if_equals(name, None, new, message)

    def remove_if_equals(self, name: str, old: ObjectId | str, message: str = "") -> bool:
        return self.set_if_equals(name, old, None, message)

    # -- raising forms -------------------------------------------------------------------------
    def set(
        self,
        name: str,
        new: ObjectId | str,
        *,
        expected: ObjectId | str | EllipsisType | None = ...,
        message: str = "",
        force: bool = False,
    ) -> None:
        """Set ``name``. With ``expected`` (None: must not exist), a lost race raises
        `ConflictError`; without it, the current value is read and replaced. ``force``: see
        `set_if_equals`."""
        if expected is ...:
            expected = self.get(name)
        if not self.set_if_equals(name, expected, new, message, force=force):
            current = self.get(name)
            raise ConflictError(
                name,
                None if expected is None else str(parse_id(expected)),
                None if current is None else str(current),
            )

    def delete(
        self,
        name: str,
        *,
        expected: ObjectId | str | EllipsisType | None = ...,
        message: str = "",
        force: bool = False,
    ) -> None:
        """Delete ``name`` (its history is kept); ``expected`` and ``force`` as for `set`."""
        if expected is ...:
            expected = self[name]
        if expected is None:
            raise NotFound("ref", name)
        if not self.set_if_equals(name, expected, None, message, force=force):
            current = self.get(name)
            if current is None:
                raise NotFound("ref", name)
            raise ConflictError(name, str(parse_id(expected)), str(current))

    def update(
        self,
        name: str,
        fn: Callable[[ObjectId | None], ObjectId | None],
        message: str = "",
        *,
        attempts: int = 100,
    ) -> ObjectId | None:
        """Read-modify-write with retries: ``fn(current) -> new``; for appends under contention.

        ``fn`` may be called several times and must be a pure function of ``current``.
        Returns the value written; raises `ConflictError` after ``attempts`` lost races.
        """
        delay = 0.001
        current = self.get(name)
        for _ in range(attempts):
            new = fn(current)
            if new == current:
                return current
            if self.set_if_equals(name, current, new, message):
                return new
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
            current = self.get(name)
        raise ConflictError(name, None, None if current is None else str(current))
