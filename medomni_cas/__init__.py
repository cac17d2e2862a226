"""medomni-cas: a content-addressed Merkle store for a medical AI benchmark's artifacts.

>>> import medomni_cas as mc
>>> store = mc.open("memory://")
>>> ws = mc.open_workspace("memory://")  # the notebook API, imported on first use
"""

from typing import TYPE_CHECKING, Any

from medomni_cas.errors import (
    AmbiguousId,
    ConflictError,
    IntegrityError,
    InvalidId,
    InvalidName,
    InvalidObject,
    MedomniError,
    NotFound,
    UnsupportedOperation,
)
from medomni_cas.store import ChunkedBlob, ObjectId, Record, RefLogEntry, Store, Tree, UnknownObject
from medomni_cas.workspace import open_store as open

if TYPE_CHECKING:
    from medomni_cas.notebook import open_workspace

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it (tool.hatch.version)

__all__ = [
    "AmbiguousId",
    "ChunkedBlob",
    "ConflictError",
    "IntegrityError",
    "InvalidId",
    "InvalidName",
    "InvalidObject",
    "MedomniError",
    "NotFound",
    "ObjectId",
    "Record",
    "RefLogEntry",
    "Store",
    "Tree",
    "UnknownObject",
    "UnsupportedOperation",
    "open",
    "open_workspace",
]


def __getattr__(name: str) -> Any:
    # the notebook API imports Bench and Studio (pyarrow.compute, parquet): only when used
    if name == "open_workspace":
        from medomni_cas.notebook import open_workspace

        return open_workspace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
