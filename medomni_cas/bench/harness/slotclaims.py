"""Which of a job's slots this harness runs: claimed one by one, re-checked once claimed.

A runner that pulls its trials one at a time (`Runner.claims_each`, the process runner)
asks `JobClaims.claim` just before it starts each one, so harnesses sharing a store share a
job slot by slot: a fast host takes more slots than a slow one, and each holds only the
slots it is running. For other runners (a batch system that takes the whole list) every
slot is claimed before the runner starts (`claim_all`).

A claim is not enough: between the harness's resume check and its claim, another harness
may have run the slot, recorded it and released its claim. So once claimed, the slot's ref
is read again; a slot that moved since the plan is released and not run (it is done).

A slot held by another live harness is set aside (`waiting`); once the runner has run what
it could, the harness looks at those again (`retry`): a slot its holder recorded meanwhile
is done, one whose holder died (or whose lease lapsed) is taken over and run here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from medomni_cas.bench.harness.claims import Holder, Lease
from medomni_cas.bench.refnames import SLOT_REFS, slot_ref
from medomni_cas.bench.runners import TrialSpec
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["JobClaims"]


@dataclass
class JobClaims:
    """The claims of one job of this harness run; ``previous`` maps each slot to run to its
    latest run when the job was planned."""

    store: Store
    lease: Lease
    previous: dict[ObjectId, ObjectId | None]
    #: Claimed by this harness and not recorded yet.
    specs: dict[ObjectId, TrialSpec] = field(default_factory=dict)
    #: Held by another live harness when last asked, with its holder.
    waiting: dict[ObjectId, tuple[TrialSpec, Holder]] = field(default_factory=dict)
    #: Run and recorded by another harness since the plan.
    moved: set[ObjectId] = field(default_factory=set)

    def claim(self, spec: TrialSpec) -> bool:
        """Whether this harness is to run ``spec`` now: claimed, and still to run."""
        holder = self.lease.claim(spec.slot)
        if holder is not None:
            self.waiting[spec.slot] = (spec, holder)
            return False
        if self.store.refs.get(slot_ref(spec.slot)) != self.previous[spec.slot]:
            self.lease.release(spec.slot)  # run by another harness since the plan: done
            self.moved.add(spec.slot)
            return False
        self.specs[spec.slot] = spec
        return True

    def claim_all(self, trials: list[TrialSpec], check: object = None) -> list[TrialSpec]:
        """`claim` each of ``trials`` (calling ``check`` first, if given); those claimed."""
        out = []
        for t in trials:
            if callable(check):
                check()
            if self.claim(t):
                out.append(t)
        return out

    def retry(self) -> list[TrialSpec]:
        """The waiting slots that may run now: those not recorded by their holder since
        (one batch of ref reads); `claim` tells which of them this harness gets."""
        if not self.waiting:
            return []
        slots = list(self.waiting)
        lasts = self.store.refs.get_many_by_id(SLOT_REFS, slots)
        out = []
        for slot, last in zip(slots, lasts, strict=True):
            spec, _ = self.waiting.pop(slot)
            if last != self.previous[slot]:
                self.moved.add(slot)
            else:
                out.append(spec)
        return out

    def holders(self) -> list[str]:
        """``"<host> pid <pid>"`` of each slot still held by another harness."""
        return [str(holder) for _, holder in self.waiting.values()]
