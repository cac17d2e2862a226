"""The errors of medomni-cas: a small tree, each carrying the data a caller needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from medomni_cas.store.sync import SyncReport

__all__ = [
    "AmbiguousId",
    "ConflictError",
    "EnvironmentFailure",
    "IntegrityError",
    "InvalidId",
    "InvalidName",
    "InvalidObject",
    "MedomniError",
    "NotFound",
    "UnsupportedOperation",
]


class MedomniError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidObject(MedomniError, ValueError):
    """A value cannot be stored: not canonical, malformed bytes, or the wrong kind."""


class InvalidId(MedomniError, ValueError):
    """A string or bytes value that is not an object id (or a usable prefix of one)."""


class InvalidName(MedomniError, ValueError):
    """A ref or tree entry name that breaks the naming rules."""


class NotFound(MedomniError, KeyError):
    """No object (or ref) under this id (or name)."""

    def __init__(self, what: str, key: str) -> None:
        super().__init__(f"{what} not found: {key}")
        self.what = what
        self.key = key

    def __str__(self) -> str:  # KeyError quotes its argument; we want a plain message
        return str(self.args[0])


class AmbiguousId(MedomniError, KeyError):
    """An id prefix that matches several objects."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:10]) + (" …" if len(candidates) > 10 else "")
        super().__init__(f"ambiguous id prefix {prefix!r}: matches {shown}")
        self.prefix = prefix
        self.candidates = candidates

    def __str__(self) -> str:
        return str(self.args[0])


class IntegrityError(MedomniError):
    """Stored bytes do not hash to the id they are stored under."""

    def __init__(self, expected: str, got: str, where: str = "") -> None:
        loc = f" in {where}" if where else ""
        super().__init__(f"object {expected} is corrupt{loc}: its bytes hash to {got}")
        self.expected = expected
        self.got = got


class ConflictError(MedomniError):
    """A ref changed under us: someone else updated it first."""

    #: Set (not always) on the error a push, pull or sync raises: what that sync did.
    report: SyncReport | None

    def __init__(self, name: str, expected: str | None, current: str | None) -> None:
        super().__init__(
            f"ref {name!r} changed concurrently: expected {expected or '(absent)'}, "
            f"found {current or '(absent)'}"
        )
        self.name = name
        self.expected = expected
        self.current = current


class EnvironmentFailure(MedomniError):
    """What the store stands on failed (a full disk or map, a damaged database, a refused
    permission, an unreachable endpoint), not the input: ``what`` says what failed. Writes
    are put-if-absent and refs compare-and-swap, so such a failure loses nothing: the
    message says so, and the command can be run again once the cause is fixed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}; nothing was lost (the store holds what it held before)")
        self.what = what


class UnsupportedOperation(MedomniError):
    """The backend cannot do this safely (e.g. multi-writer refs without conditional writes)."""
