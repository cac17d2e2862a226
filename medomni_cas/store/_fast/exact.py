"""The switch that sends every check through the exact definitions, and that route itself.

The fast paths must give the answers of `encoding.links` and `encoding.validate_canonical`,
which are the definitions. With the environment variable ``MEDOMNI_EXACT_CHECKS=1`` every
walk and check of the store reads each object by them instead (a batch reader's links and
canonical check, a batch checker's one-decode path, the pool's helper processes): as slow as
that is, and a way to tell a fast-path bug from a damaged store. The suite runs its checks
once this way (``tests/test_exact_checks.py``).

An environment variable, read where each walk starts (when its `BatchReader` or `CheckPool`
is made), rather than an argument: it must reach walks whose public signatures should not
carry it (`Store.walk`, sync, fsck) and the helper processes a pool starts, and a walk reads
it once, so that all of its batches take one route. The classes also take ``exact`` as an
argument, for a caller that must choose.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding

__all__ = ["ENV", "exact_checks", "links"]

#: Set to ``1`` for exact checks everywhere.
ENV = "MEDOMNI_EXACT_CHECKS"


def exact_checks() -> bool:
    """Whether walks and checks starting now take the exact route (``MEDOMNI_EXACT_CHECKS``)."""
    return os.environ.get(ENV, "") not in ("", "0")


def links(
    datas: Sequence[bytes], *, owners: bool = True
) -> tuple[list[bytes], list[int], dict[int, InvalidObject]]:
    """`BatchReader.links` by `encoding.links`, one object at a time: links by owner, each
    owner's in the order of its bytes (each once); without ``owners``, no owners list."""
    ids: list[bytes] = []
    of: list[int] = []
    errors: dict[int, InvalidObject] = {}
    for i, data in enumerate(datas):
        try:
            found = encoding.links(data)
        except InvalidObject as e:
            errors[i] = e
            continue
        ids += found
        if owners:
            of += [i] * len(found)
    return ids, of, errors
