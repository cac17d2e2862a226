"""The key layout every file-like backend shares: object ids as paths, ref names as file names.

Objects fan out by the first two hex characters of their id (``ab/cdef…``), as git and
dvc do, so that no folder holds more than 1/256 of the store. Ref names are
percent-encoded into one flat file name, so that ``a`` and ``a/b`` coexist in one folder;
a name too long for a file name is hashed, and its full form kept beside it.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

import blake3

__all__ = ["MAX_ENCODED_NAME", "decode_ref_name", "encode_ref_name", "key_of", "object_path"]

# File names are limited to 255 bytes on most filesystems; longer names are hashed.
MAX_ENCODED_NAME = 200
_HEXDIGITS = frozenset("0123456789abcdef")


def object_path(key: bytes) -> tuple[str, str]:
    """The fan-out folder and file name of an object id: ``("ab", "cdef…")``."""
    h = key.hex()
    return h[:2], h[2:]


def key_of(folder: str, name: str) -> bytes | None:
    """The id stored under ``folder/name``, or None for anything that is not an object."""
    h = folder + name
    if len(folder) != 2 or len(h) % 2 or not name or not _HEXDIGITS.issuperset(h):
        return None
    return bytes.fromhex(h)


def encode_ref_name(name: str) -> str:
    """A flat file name for a ref name: ``a`` and ``a/b`` must both fit in one folder.

    Ref names never contain ``~``, and `quote` never produces it, so a leading ``~`` marks a
    hashed name whose full form is stored separately.
    """
    quoted = quote(name, safe="")
    if len(quoted) <= MAX_ENCODED_NAME:
        return quoted
    return "~" + blake3.blake3(name.encode()).hexdigest()[:40]


def decode_ref_name(encoded: str) -> str | None:
    """The ref name of a flat file name, or None when it is hashed (look it up)."""
    return None if encoded.startswith("~") else unquote(encoded)
