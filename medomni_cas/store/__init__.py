"""The Merkle object store: plumbing that knows nothing of MedOmni."""

from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import ChunkedBlob, Tree, UnknownObject
from medomni_cas.store.refs import RefLogEntry
from medomni_cas.store.store import Store
from medomni_cas.store.url import open_store

__all__ = [
    "ChunkedBlob",
    "ObjectId",
    "Record",
    "RefLogEntry",
    "Store",
    "Tree",
    "UnknownObject",
    "open_store",
]
