"""Ref update policies by name prefix: rules every path that moves or deletes a ref runs.

As a git server runs its receive hooks, `Refs` runs the policies of a ref's name before
every update of it, whoever asks: ``Refs.set`` and friends, ``cas ref set/delete``, bundle
import, push, pull and clone all move refs through `Refs.set_if_equals`. The store knows
nothing of what a name holds: the package that does registers a policy.

Registration
    By entry point, in the group ``medomni.ref_policies``: the entry point's *name* is the
    first component of the names it covers (``tasksets = "pkg.mod:POLICY"`` covers every
    name starting ``tasksets/``), so that finding out whether a name is covered imports
    nothing; the object is loaded the first time a covered name moves. `register` adds one
    in-process (tests, embedders) for any prefix.

Cost
    A name no policy covers costs one ``str.startswith`` on a tuple of prefixes, read once
    per process from the installed entry points (`covered`).

Refusing
    A policy raises `RefPolicyRefused` (`RefPolicy.refuse` makes one) naming the ref, the
    old and new ids and why. A person may override it with ``force=True`` and a message
    (CLI: ``--force -m MSG``); the ref's history then records the update as forced.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from medomni_cas.errors import ConflictError
from medomni_cas.store.ids import ObjectId

if TYPE_CHECKING:
    from medomni_cas.store.store import Store

__all__ = [
    "ENTRY_POINT_GROUP",
    "RefPolicy",
    "RefPolicyRefused",
    "check",
    "covered",
    "policies_for",
    "register",
]

ENTRY_POINT_GROUP = "medomni.ref_policies"


class RefPolicyRefused(ConflictError):
    """A ref update that a policy of the ref's name refuses.

    ``name`` is the ref, ``old`` and ``new`` the hex ids (None: absent / delete),
    ``reason`` the policy's words."""

    def __init__(self, name: str, old: str | None, new: str | None, reason: str) -> None:
        super().__init__(name, old, old)
        self.old = old
        self.new = new
        self.reason = reason
        self.args = (
            f"ref {name!r}: update {old or '(absent)'} -> {new or '(delete)'} refused: "
            f"{reason} (a person may override it: --force -m MESSAGE)",
        )


class RefPolicy(ABC):
    """A rule on the updates of the refs under one prefix.

    ``check`` gets the store whose ref moves, the ref's name, its value now and the value
    asked for (None: created / deleted); the new value's object is already in ``store``.
    It returns to allow the update and raises `RefPolicyRefused` to refuse it. It must
    decide from the records themselves, never from the store's refs (a remote's refs may be
    anything) and never from reachability (a crafted object may link anything).
    """

    @abstractmethod
    def check(
        self, store: Store, name: str, old: ObjectId | None, new: ObjectId | None
    ) -> None: ...

    @staticmethod
    def refuse(name: str, old: ObjectId | None, new: ObjectId | None, why: str) -> RefPolicyRefused:
        """The error to raise: ``raise self.refuse(name, old, new, "why")``."""
        return RefPolicyRefused(
            name, None if old is None else old.hex(), None if new is None else new.hex(), why
        )


class _Registry:
    """The policies by prefix: entry points (loaded on first use) and registered ones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prefixes: tuple[str, ...] | None = None
        self.entry_points: dict[str, EntryPoint | RefPolicy] = {}  # loaded on first use
        self.registered: dict[str, list[RefPolicy]] = {}

    def load_prefixes(self) -> tuple[str, ...]:
        with self.lock:
            if self.prefixes is None:
                for ep in entry_points(group=ENTRY_POINT_GROUP):
                    self.entry_points.setdefault(ep.name.rstrip("/") + "/", ep)
                self._refresh()
            assert self.prefixes is not None
            return self.prefixes

    def _refresh(self) -> None:
        self.prefixes = tuple(sorted({*self.entry_points, *self.registered}))

    def policies(self, name: str) -> list[RefPolicy]:
        out: list[RefPolicy] = []
        for prefix in self.load_prefixes():
            if not name.startswith(prefix):
                continue
            if prefix in self.entry_points:
                out.append(self._loaded(prefix))
            out.extend(self.registered.get(prefix, ()))
        return out

    def _loaded(self, prefix: str) -> RefPolicy:
        with self.lock:
            found = self.entry_points[prefix]
            if isinstance(found, RefPolicy):
                return found
            policy = found.load()
            if not isinstance(policy, RefPolicy):
                raise TypeError(
                    f"entry point {found.name!r} of {ENTRY_POINT_GROUP} ({found.value}) is a "
                    f"{type(policy).__name__}, not a RefPolicy"
                )
            self.entry_points[prefix] = policy
            return policy


_REGISTRY = _Registry()


def covered(name: str) -> bool:
    """Whether any policy covers ``name``: the check on every ref update's path."""
    prefixes = _REGISTRY.prefixes
    if prefixes is None:
        prefixes = _REGISTRY.load_prefixes()
    return name.startswith(prefixes)


def policies_for(name: str) -> list[RefPolicy]:
    """The policies that cover ``name``, the entry points' first."""
    return _REGISTRY.policies(name)


def check(store: Store, name: str, old: ObjectId | None, new: ObjectId | None) -> None:
    """Run every policy of ``name`` on the update ``old -> new``; raises `RefPolicyRefused`."""
    if old == new:
        return
    for policy in policies_for(name):
        policy.check(store, name, old, new)


@contextmanager
def register(prefix: str, policy: RefPolicy) -> Iterator[RefPolicy]:
    """Run ``policy`` on the refs whose names start with ``prefix``, in this process, for
    the duration of the ``with`` block (tests, embedders that install no entry point)."""
    if not prefix or not isinstance(policy, RefPolicy):
        raise ValueError("register needs a non-empty prefix and a RefPolicy")
    _REGISTRY.load_prefixes()
    with _REGISTRY.lock:
        _REGISTRY.registered.setdefault(prefix, []).append(policy)
        _REGISTRY._refresh()
    try:
        yield policy
    finally:
        with _REGISTRY.lock:
            policies = _REGISTRY.registered[prefix]
            policies.remove(policy)
            if not policies:
                del _REGISTRY.registered[prefix]
            _REGISTRY._refresh()
