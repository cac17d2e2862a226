"""The ``replay`` runner: repeats the answers of earlier runs, with no model calls.

Its agent config names the runs to repeat in ``settings.source``: the name of an agent
config that already ran the same task set (the harness records each config under
``bench/agents/<name>``). Each slot repeats the final run of the source's slot for the same
atom, arm (and rung) and repetition, falling back to repetition 1 (`source_run`, which the
Harbor runner's replay agent reads too); a slot with nothing to repeat fails as the agent's
own outcome, naming the slot it looked for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import ClassVar

from medomni_cas.bench.process import now_iso
from medomni_cas.bench.records import RunRecord, slot_digests
from medomni_cas.bench.refnames import agent_ref
from medomni_cas.bench.runners import Job, Runner, RunnerError, Trial
from medomni_cas.bench.slottables import latest_run
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["ReplayRunner", "source_run"]


def source_run(
    store: Store,
    source: ObjectId,
    atom: ObjectId,
    arm_label: str,
    repetition: int,
    atoms: Sequence[ObjectId] = (),
) -> RunRecord | None:
    """The run a replay repeats: the final run of agent config ``source``'s slot for
    ``atom`` under ``arm_label`` at ``repetition``, else at repetition 1; None if neither ran.

    ``atoms`` are the job's atoms in order (`Job.atoms`), of which the slots' chunks are
    made (`medomni_cas.bench.slottables`); without them only the per-slot refs of stores
    written before chunks are found."""
    order = list(atoms) if atom in atoms else [atom]
    i = order.index(atom)
    for rep in dict.fromkeys((repetition, 1)):
        last = latest_run(store, slot_digests(order, source, arm_label, rep), i)
        if last is not None:
            return store.get(last, RunRecord)
    return None


class ReplayRunner(Runner):
    name: ClassVar[str] = "replay"
    description: ClassVar[str] = "repeats the answers of earlier runs (no model calls)"
    scaffolds: ClassVar[tuple[str, ...]] = ("replay",)

    def _source(self, job: Job) -> ObjectId:
        source = job.agent.options.get("source")
        if not isinstance(source, str) or not source:
            raise RunnerError(
                f"agent config {job.agent.name}: replay needs settings.source, the name of "
                "an agent config whose runs to repeat"
            )
        sid = job.store.refs.get(agent_ref(source))
        if sid is None:
            raise RunnerError(f"replay source {source!r} has never run in {job.store.url}")
        return sid

    # docstring inherited
    def check(self, job: Job) -> list[str]:
        try:
            self._source(job)
        except RunnerError as e:
            return [str(e)]
        return []

    # docstring inherited
    def run(self, job: Job) -> Iterator[Trial]:
        source = self._source(job)
        for spec in job.trials:
            started, t0 = now_iso(), time.monotonic()
            run = source_run(
                job.store, source, spec.atom_id, job.arm_label, job.repetition, job.atoms
            )
            trial = Trial(
                slot=spec.slot,
                attempt=spec.attempt,
                outcome="answered",
                started=started,
                finished=now_iso(),
                elapsed_ms=0,
                served_model=job.agent.served_model,
                tokens_in=0,
                tokens_out=0,
                cost_usd=0.0,
                environment="local",  # no agent runs: nothing to isolate, nothing to reach
                isolation="none",
            )
            if run is None or run.answer is None:
                trial.outcome = "agent-failed"
                trial.errors.append(f"nothing to replay for atom {spec.atom_id} ({job.arm_label})")
            else:
                trial.answer = job.store.read_blob(run.answer)
                trial.logs = {"replayed.txt": f"replayed run {run.run_id}\n".encode()}
            trial.elapsed_ms = int((time.monotonic() - t0) * 1000)
            yield trial
