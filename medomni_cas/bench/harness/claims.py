"""Claims: a lease over a run slot, so two harnesses on one store never run it twice.

A harness claims a slot create-only (``runs/claims/<slot>``, see `medomni_cas.bench.refnames`)
before it runs, and releases the claim once the slot's run is recorded. A claim is a blob
``"<host> <pid> <time>"``; one whose process is gone (same host) or older than the timeout
is stale and taken over, or removed when its slot has finished (its holder was killed after
recording the run and before releasing the claim).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection, Iterable

from medomni_cas.bench.refnames import CLAIM_REFS, claim_ref, slot_of_claim
from medomni_cas.store.host import pid_alive
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["claim", "release", "sweep"]


def _claim_blob(store: Store) -> ObjectId:
    me = f"{socket.gethostname()} {os.getpid()} {time.time():.3f}\n"
    return store.put_blob(me.encode())


def _stale(store: Store, claim: ObjectId, timeout: float) -> bool:
    try:
        host, pid, t = store.read_blob(claim).decode().split()
    except (ValueError, KeyError):
        return True
    if time.time() - float(t) > timeout:
        return True
    return host == socket.gethostname() and not pid_alive(int(pid))


def claim(store: Store, slot: ObjectId, timeout: float) -> bool:
    """Claim ``slot`` for this process; False when a live claim of another holds it."""
    ref = claim_ref(slot)
    mine = _claim_blob(store)
    if store.refs.add_if_new(ref, mine, "claim"):
        return True
    current = store.refs.get(ref)
    if current is None:
        return store.refs.add_if_new(ref, mine, "claim")
    if _stale(store, current, timeout):
        return store.refs.set_if_equals(ref, current, mine, "take over a stale claim")
    return False


def sweep(store: Store, slots: Iterable[bytes], running: Collection[bytes], timeout: float) -> None:
    """Remove the stale claims of a job's ``slots`` that are not to run: a harness killed
    after recording a slot's run and before releasing its claim leaves one behind. A claim
    whose holder is alive is kept (it may be just about to release it)."""
    claims = store.refs.as_dict(CLAIM_REFS)  # only slots being run: few
    if not claims:
        return
    finished = set(slots) - set(running)
    for name, held in claims.items():
        slot = slot_of_claim(name)
        if slot in finished and _stale(store, held, timeout):
            store.refs.remove_if_equals(name, held, "stale claim of a finished slot")


def release(store: Store, slot: ObjectId) -> None:
    """Give ``slot`` up: its run is recorded, or it was not run after all."""
    ref = claim_ref(slot)
    current = store.refs.get(ref)
    if current is not None:
        store.refs.remove_if_equals(ref, current, "done")
