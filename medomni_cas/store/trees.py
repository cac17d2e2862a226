"""Trees: validated entry names (building from and exporting to folders comes with them)."""

from __future__ import annotations

from medomni_cas.errors import InvalidName

__all__ = ["check_entry_name"]

MAX_ENTRY_NAME = 255


def check_entry_name(name: object) -> str:
    """Return ``name`` if it can name a tree entry, else raise `InvalidName` saying why."""
    if not isinstance(name, str):
        raise InvalidName(f"a tree entry name must be a string, got {type(name).__name__}")
    if name in ("", ".", ".."):
        raise InvalidName(f"tree entry name {name!r} is not allowed")
    if "/" in name or "\\" in name:
        raise InvalidName(f"tree entry name {name!r} contains a path separator")
    if "\x00" in name:
        raise InvalidName(f"tree entry name {name!r} contains NUL")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_ENTRY_NAME:
        raise InvalidName(f"tree entry name is longer than {MAX_ENTRY_NAME} bytes: {name[:40]!r}…")
    return name
