"""The ``replay`` runner: repeats the answers of earlier runs, with no model calls.

Its agent config names the runs to repeat in ``settings.source``: the name of an agent
config that already ran the same task set (the harness records each config under
``bench/agents/<name>``). Each slot repeats the final run of the source's slot for the same
atom, arm (and rung) and repetition, falling back to repetition 1; a slot with nothing to
repeat fails as the agent's own outcome, naming the slot it looked for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import ClassVar

from medomni_cas.bench.process import now_iso
from medomni_cas.bench.records import RunRecord, slot_id
from medomni_cas.bench.runners import Job, Runner, RunnerError, Trial

__all__ = ["ReplayRunner", "agent_ref", "slot_ref"]


def agent_ref(name: str) -> str:
    return f"bench/agents/{name}"


#: A run slot's ref is this prefix and the slot id's hex: it points at the slot's latest run.
SLOT_REFS = "runs/slots/"


def slot_ref(slot: bytes) -> str:
    return f"{SLOT_REFS}{slot.hex()}"


class ReplayRunner(Runner):
    name: ClassVar[str] = "replay"
    description: ClassVar[str] = "repeats the answers of earlier runs (no model calls)"

    def _source(self, job: Job) -> bytes:
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

    def check(self, job: Job) -> list[str]:
        try:
            self._source(job)
        except RunnerError as e:
            return [str(e)]
        return []

    def run(self, job: Job) -> Iterator[Trial]:
        source = self._source(job)
        for spec in job.trials:
            started, t0 = now_iso(), time.monotonic()
            run = None
            for rep in dict.fromkeys((job.repetition, 1)):
                sid = slot_id(spec.atom_id, source, job.arm_label, rep)  # type: ignore[arg-type]
                ref = job.store.refs.get(slot_ref(sid))
                if ref is not None:
                    run = job.store.get(ref, RunRecord)
                    break
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
            )
            if run is None or run.answer is None:
                trial.outcome = "agent-failed"
                trial.errors.append(f"nothing to replay for atom {spec.atom_id} ({job.arm_label})")
            else:
                trial.answer = job.store.read_blob(run.answer)
                trial.logs = {"replayed.txt": f"replayed run {run.run_id}\n".encode()}
            trial.elapsed_ms = int((time.monotonic() - t0) * 1000)
            yield trial
