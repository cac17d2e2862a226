"""Claims are leases: a harness holds the slots it runs while its heartbeat says it is alive.

Claims
------
A harness claims a slot create-only (``runs/claims/<slot>``, see `medomni_cas.bench.refnames`)
before it runs it, and releases the claim once the slot's run is recorded. The claim is a
blob naming its holder, ``"<host> <pid> <start> <nonce> <lease>"``: the process's start time
(`medomni_cas.store.host.process_start`), so a pid the kernel handed to another process is
not mistaken for the holder, and the nonce of the harness run, which names its heartbeat.
Every claim of one harness run is the same blob.

Heartbeat
---------
One ref per harness run, ``runs/leases/<nonce>``, points at a blob stamped with the time; a
background thread renews it every lease/3 (one write per harness, however many slots it
claims). A claim is live while its holder's heartbeat was renewed within the holder's lease.
A lapsed lease is ended by compare-and-swap on the heartbeat ref (so its holder, should it
wake, fails its next renewal and stops), then its claims are taken over by compare-and-swap
on each claim ref. On the holder's own host a claim is stale at once when its pid is gone
or names a process that started at another time. Hosts sharing a store need clocks that
agree to well within a lease.

A harness whose heartbeat cannot be renewed for a whole lease (the store is gone) or was
ended by another harness has lost its claims: `Lease.check` raises `LeaseLost`, and the
harness starts no more trials.

A claim made before leases (``"<host> <pid> <time>"``, no heartbeat) keeps the rule it was
made under: live for six hours, or while its pid lives on its host.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from medomni_cas.bench.refnames import CLAIM_REFS, LEASE_REFS, claim_ref, lease_ref, slot_of_claim
from medomni_cas.errors import MedomniError
from medomni_cas.store.host import pid_alive, process_start
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["DEFAULT_LEASE", "LEGACY_TIMEOUT", "Holder", "Lease", "LeaseLost"]

DEFAULT_LEASE = 60.0
LEGACY_TIMEOUT = 6 * 3600.0  # the timeout claims without a heartbeat were made under
_RACES = 8  # compare-and-swap attempts before a claim is left to whoever keeps winning
_LIVE_FOR = 1.0  # seconds a live holder's verdict is reused (its claims come in thousands)


class LeaseLost(MedomniError):
    """This harness's lease lapsed or was ended: it holds no claim it can trust. The harness
    sets ``report`` (what it recorded) and ``job`` (the job it stopped) on the way out."""

    report: Any = None
    job: Any = None


@dataclass(frozen=True)
class Holder:
    """Who holds a claim: a harness run on ``host`` in process ``pid``."""

    host: str
    pid: int
    start: str = ""  # `process_start` of the pid; "" where it cannot be told
    nonce: str = ""  # names its heartbeat ``runs/leases/<nonce>``; "" before leases
    lease: float = DEFAULT_LEASE  # seconds its heartbeat may go unrenewed

    def line(self) -> str:
        return f"{self.host} {self.pid} {self.start or '-'} {self.nonce} {self.lease:g}"

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid}"


def _parse_claim(text: str) -> tuple[Holder, float | None] | None:
    """The holder a claim blob names, and the time of a claim made before leases."""
    fields = text.split()
    try:
        if len(fields) == 5:
            host, pid, start, nonce, lease = fields
            holder = Holder(host, int(pid), "" if start == "-" else start, nonce, float(lease))
            return (holder, None) if holder.lease > 0 and nonce else None
        if len(fields) == 3:
            return Holder(fields[0], int(fields[1]), lease=LEGACY_TIMEOUT), float(fields[2])
    except ValueError:
        pass
    return None


def _read_beat(store: Store, beat: ObjectId) -> tuple[Holder, float] | None:
    """The holder a heartbeat blob names and the time it was stamped with; None when it is
    not a heartbeat."""
    try:
        fields = store.read_blob(beat).decode().split()
        parsed = _parse_claim(" ".join(fields[:5])) if len(fields) == 6 else None
        if parsed is None or parsed[1] is not None:
            return None
        return parsed[0], float(fields[5])
    except (KeyError, MedomniError, UnicodeDecodeError, ValueError):
        return None


class Lease:
    """This harness run's claims and their heartbeat; one per harness run.

    Use it as a context manager: `claim` starts the heartbeat the first time, `close` (on
    leaving the block) stops it, releases every claim still held and ends the heartbeat.
    ``timeout`` is the lease in seconds: how long others wait for a renewal before they
    take this harness's claims over.
    """

    def __init__(self, store: Store, timeout: float = DEFAULT_LEASE) -> None:
        if not timeout > 0:
            raise MedomniError(
                f"--claim-timeout must be a positive number of seconds, got {timeout}"
            )
        self.store = store
        self.timeout = float(timeout)
        pid = os.getpid()
        self.holder = Holder(
            socket.gethostname(), pid, process_start(pid) or "", secrets.token_hex(8), self.timeout
        )
        self._ref = lease_ref(self.holder.nonce)
        self._claim: ObjectId | None = None  # the claim blob, made when the heartbeat starts
        self._beat: ObjectId | None = None  # what the heartbeat ref points at (ours)
        self._renewed = 0.0  # monotonic time of the stamp in ``_beat``
        self._lost: str | None = None
        self._held: set[bytes] = set()
        self._verdicts: dict[ObjectId, tuple[Holder | None, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except Exception:
            if exc is None:
                raise  # else the error that stopped the harness says more than this one

    @property
    def held(self) -> frozenset[bytes]:
        """The slots claimed and not yet released."""
        return frozenset(self._held)

    # -- the heartbeat ---------------------------------------------------------------------
    def _stamp(self) -> tuple[ObjectId, float]:
        renewed = time.monotonic()
        line = f"{self.holder.line()} {time.time():.3f}\n"
        return self.store.put_blob(line.encode()), renewed

    def start(self) -> None:
        """Write the heartbeat and start renewing it (`claim` does this the first time)."""
        if self._thread is not None:
            return
        self._end_lapsed_leases()
        self._claim = self.store.put_blob(f"{self.holder.line()}\n".encode())
        beat, renewed = self._stamp()
        if not self.store.refs.add_if_new(self._ref, beat, "lease"):
            raise LeaseLost(f"{self._ref} exists already: another harness drew the same nonce")
        self._beat, self._renewed = beat, renewed
        self._thread = threading.Thread(target=self._renew, name="medomni-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.timeout / 3):
            try:
                beat, renewed = self._stamp()
                ok = self.store.refs.set_if_equals(self._ref, self._beat, beat, "renew")
            except Exception as e:  # the store is gone, or out of reach for now
                if time.monotonic() - self._renewed > self.timeout:
                    self._lost = f"the lease could not be renewed for {self.timeout:g} s: {e}"
                    return
                continue
            if not ok:
                self._lost = (
                    f"another harness ended this one's lease ({self._ref}): it was not "
                    f"renewed within {self.timeout:g} s"
                )
                return
            self._beat, self._renewed = beat, renewed

    def check(self) -> None:
        """Raise `LeaseLost` when the claims can no longer be trusted: the heartbeat was
        ended by another harness, or not renewed for a whole lease."""
        if self._thread is None:
            return  # nothing claimed yet
        if self._lost is None and time.monotonic() - self._renewed > self.timeout:
            self._lost = f"the lease was not renewed within {self.timeout:g} s"
        if self._lost is not None:
            raise LeaseLost(f"stopped: {self._lost}")

    def close(self) -> None:
        """Stop the heartbeat, release every claim still held, then end the heartbeat."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout)
        if self._claim is not None:
            for slot in sorted(self._held):
                self.store.refs.remove_if_equals(claim_ref(slot), self._claim, "released")
        self._held.clear()
        if self._beat is not None:
            self.store.refs.remove_if_equals(self._ref, self._beat, "lease ended")
            self._beat = None

    # -- claims ----------------------------------------------------------------------------
    def claim(self, slot: bytes) -> Holder | None:
        """Claim ``slot``: None when this harness holds it now (made, or taken over from a
        stale holder), else the live `Holder` that has it."""
        self.start()
        self.check()
        assert self._claim is not None
        refs, ref, mine = self.store.refs, claim_ref(slot), self._claim
        self._held.add(bytes(slot))  # first: an interrupt after the write leaves it released
        current: ObjectId | None = None
        for _ in range(_RACES):
            if refs.add_if_new(ref, mine, "claim"):
                return None
            current = refs.get(ref)
            if current is None:
                continue  # released meanwhile
            if current == mine:
                return None
            holder = self.holder_of(current)
            if holder is not None:
                self._held.discard(bytes(slot))
                return holder
            if refs.set_if_equals(ref, current, mine, "take over a stale claim"):
                return None
        self._held.discard(bytes(slot))
        parsed = None if current is None else self._read(current)
        return parsed[0] if parsed is not None else Holder("?", 0)

    def holds(self, slot: bytes) -> bool:
        """Whether ``slot``'s claim is still this harness's (one ref read): after a lapse,
        another harness may have taken it over and be running it."""
        return self._claim is not None and self.store.refs.get(claim_ref(slot)) == self._claim

    def release(self, slot: bytes) -> None:
        """Give ``slot`` up: its run is recorded, or it was not run after all."""
        if self._claim is not None:
            self.store.refs.remove_if_equals(claim_ref(slot), self._claim, "done")
        self._held.discard(bytes(slot))

    def sweep(self, slots: Iterable[bytes], running: Collection[bytes]) -> None:
        """Remove the stale claims of a job's ``slots`` that are not to run: a harness killed
        after recording a slot's run and before releasing its claim leaves one behind. A claim
        whose holder is live is kept (it may be just about to release it)."""
        claims = self.store.refs.as_dict(CLAIM_REFS)  # only slots being run: few
        if not claims:
            return
        finished = set(slots) - set(running)
        for name, held in claims.items():
            slot = slot_of_claim(name)
            if slot in finished and held != self._claim and self.holder_of(held) is None:
                self.store.refs.remove_if_equals(name, held, "stale claim of a finished slot")

    # -- judging another harness's claim -----------------------------------------------------
    def holder_of(self, claim: ObjectId) -> Holder | None:
        """The live holder of a claim blob, or None when the claim is stale."""
        now = time.monotonic()
        cached = self._verdicts.get(claim)
        if cached is not None and (cached[0] is None or now < cached[1]):
            return cached[0]  # a stale claim never comes alive again
        holder = self._judge(claim)
        self._verdicts[claim] = (holder, now + _LIVE_FOR)
        return holder

    def _read(self, claim: ObjectId) -> tuple[Holder, float | None] | None:
        try:
            return _parse_claim(self.store.read_blob(claim).decode())
        except (KeyError, MedomniError, UnicodeDecodeError):
            return None

    def _gone(self, holder: Holder) -> bool:
        """Whether a holder on this host is no longer running: its pid is free, or taken by
        a process that started at another time."""
        if holder.host != self.holder.host:
            return False
        if not pid_alive(holder.pid):
            return True
        start = process_start(holder.pid) if holder.start else None
        return start is not None and start != holder.start

    def _judge(self, claim: ObjectId) -> Holder | None:
        parsed = self._read(claim)
        if parsed is None:
            return None  # not a claim any harness made
        holder, since = parsed
        if since is not None:  # made before leases: no heartbeat to read
            if self._gone(holder) or time.time() - since > LEGACY_TIMEOUT:
                return None
            return holder
        refs, ref = self.store.refs, lease_ref(holder.nonce)
        for _ in range(_RACES):
            beat = refs.get(ref)
            if beat is None:
                return None  # its harness ended the lease, or another ended it as lapsed
            if self._gone(holder):
                refs.remove_if_equals(ref, beat, "its harness is gone")
                return None
            stamped = _read_beat(self.store, beat)
            if stamped is not None and time.time() - stamped[1] <= holder.lease:
                return holder
            # end the lapsed lease first: its holder, should it wake, fails to renew and stops
            if refs.remove_if_equals(ref, beat, "lapsed: not renewed within its lease"):
                return None
        return holder  # renewed as often as we looked: it is alive

    def _end_lapsed_leases(self) -> None:
        """End the heartbeats of harnesses that were killed and whose claims nobody met."""
        for name, beat in self.store.refs.items(LEASE_REFS):
            stamped = _read_beat(self.store, beat)
            if (
                stamped is None
                or time.time() - stamped[1] > stamped[0].lease
                or self._gone(stamped[0])
            ):
                self.store.refs.remove_if_equals(name, beat, "lapsed: not renewed within its lease")
