"""medomni-cas: a content-addressed Merkle store for a medical AI benchmark's artifacts.

>>> import medomni_cas as mc
>>> store = mc.open("memory://")
"""

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
from medomni_cas.store.url import open_store as open

__version__ = "0.1.0"

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
]
