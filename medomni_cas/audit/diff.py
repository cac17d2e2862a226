"""Which inputs of two results differ, named exactly.

``diff_results(store, a, b)`` compares two `Result` objects the Merkle way: ids first, and
it reads further only below ids that differ, so two results that share most of their
inputs cost little however large they are. It names:

* the result's own settings: scorer and version, ``n_boot``, ``seed``;
* the task set: name, builder, arms, pairs and the N each is pinned at;
* per pair and arm: the build config fields that differ, down to the key inside the
  template, cohort, labels, targets or arm definition (``template.agent.statement``), with
  the version N.X as ``cohort version``;
* per patient: the evidence files that differ (a tree diff of the two evidence trees), the
  prediction time, the answers that changed (patient keys are the dataset's pseudonymous
  keys), and patients that entered or left the cohort;
* per atom task, what is not explained by the above: the instruction (the lines that
  differ), the staged families, the environment, the submission path, the format check;
* per job (matched by agent, arm and repetition): the agent config fields (model, served
  model, scaffold, limits, options), the runner, and, over the runs that differ, the served
  models the runs reported, the encoders served, the outcomes, and how many runs differ.

A difference shared by several arms of a pair is one `Difference` naming those arms.
Per-patient lines stop at ``limit`` per pair and kind; the rest are counted in one line.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from medomni_cas.audit._common import arm_label, load_result, short
from medomni_cas.bench.records import AgentConfig, JobRecord, Result, RunRecord
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.trees import diff_trees
from medomni_cas.studio.records import (
    AnswerKey,
    AtomTask,
    BuildConfig,
    BuildResult,
    Content,
    FormatCheck,
    SetBuild,
    SetEntry,
    TaskSetRecord,
)

__all__ = ["CATEGORIES", "Difference", "diff_results", "render_text"]

#: What a `Difference` is about, in the order a diff lists them.
CATEGORIES = (
    "result",
    "task-set",
    "build",
    "build-config",
    "patients",
    "evidence",
    "answers",
    "instruction",
    "atom",
    "jobs",
    "agent-config",
    "runner",
    "served-model",
    "encoders",
    "runs",
)
_SHOWN = 80  # characters of a value shown in text (JSON has it whole)
_HEX = re.compile(r"[0-9a-f]{64}")


class Difference(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One input that differs between result A (``old``) and result B (``new``).

    ``category`` is one of `CATEGORIES`; ``field`` names what differs (a config field path
    such as ``template.agent.statement``, ``evidence labs.jsonl``, ``served model``);
    ``change`` is "changed", or "added"/"removed" when only B/A has it. ``pair``, ``arms``,
    ``patient``, ``job`` and ``agent`` say where; ``note`` adds what a count or a summary
    needs.
    """

    category: str
    field: str
    old: Any = None
    new: Any = None
    change: str = "changed"
    pair: str = ""
    arms: list[str] = []
    patient: str = ""
    job: str = ""
    agent: str = ""
    note: str = ""

    @property
    def scope(self) -> str:
        parts = []
        if self.agent:
            parts.append(f"agent {self.agent}")
        if self.job:
            parts.append(f"job {self.job}")
        if self.pair:
            parts.append(self.pair + (f" {', '.join(self.arms)}" if self.arms else ""))
        if self.patient:
            parts.append(f"patient {self.patient}")
        return " ".join(parts) or self.category

    def text(self) -> str:
        if self.change == "changed":
            what = f"{self.field} {_fmt(self.old)} -> {_fmt(self.new)}"
        else:
            value = self.new if self.change == "added" else self.old
            shown = f": {_fmt(value)}" if value is not None else ""
            only = "B" if self.change == "added" else "A"
            what = f"{self.field} {self.change} (only in {only}){shown}"
        note = f" ({self.note})" if self.note else ""
        return f"{self.scope}: {what}{note}"


def _fmt(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str) and len(value) == 64 and _HEX.fullmatch(value):
        return value[:12]  # an object id (an evidence file's blob): its short form
    if isinstance(value, str):
        text = value if value and " " not in value and "\n" not in value else json.dumps(value)
    elif isinstance(value, ObjectId):
        text = value.hex()[:12]
    else:
        text = json.dumps(msgspec.to_builtins(value), sort_keys=True, default=str)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _value_diff(path: str, old: Any, new: Any) -> Iterable[tuple[str, Any, Any]]:
    """(path, old, new) for each leaf that differs: into maps by key, into lists of the
    same length by index; anything else (or a missing key: old/new None) as a whole."""
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        # the order the config states them in (a struct's fields, a file's keys)
        for k in [*old, *(k for k in new if k not in old)]:
            sub = f"{path}.{k}" if path else str(k)
            yield from _value_diff(sub, old.get(k), new.get(k))
    elif isinstance(old, list | tuple) and isinstance(new, list | tuple) and len(old) == len(new):
        for i, (x, y) in enumerate(zip(old, new, strict=True)):
            yield from _value_diff(f"{path}[{i}]", x, y)
    else:
        yield path, old, new


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=lambda o: o.hex() if isinstance(o, bytes) else o)


_JobKey = tuple[str, str, str, int]  # agent name, arm, variant, repetition


class _Differ:
    def __init__(self, store: Store, limit: int | None) -> None:
        self.store = store
        self.limit = limit
        self.out: list[Difference] = []
        self.seen: set[tuple[bytes, bytes]] = set()  # (old id, new id) pairs already diffed
        self.evidence_named: set[tuple[str, str]] = set()  # (pair, patient)

    def add(self, **kw: Any) -> None:
        self.out.append(Difference(**kw))

    def once(self, a: bytes, b: bytes) -> bool:
        """True the first time this pair of ids is compared (shared objects diff once)."""
        if (a, b) in self.seen:
            return False
        self.seen.add((a, b))
        return True

    # -- result and task set ----------------------------------------------------------------
    def result(self, a: Result, b: Result) -> None:
        for f in ("scorer", "scorer_version", "n_boot", "seed"):
            if getattr(a, f) != getattr(b, f):
                self.add(category="result", field=f, old=getattr(a, f), new=getattr(b, f))
        if a.task_set != b.task_set:
            self.task_set(a.task_set, b.task_set)
        if a.set_build != b.set_build:
            self.set_build(a.set_build, b.set_build)
        if a.jobs != b.jobs:
            self.jobs(a.jobs, b.jobs)

    def task_set(self, a_id: ObjectId, b_id: ObjectId) -> None:
        a, b = self.store.get(a_id, TaskSetRecord), self.store.get(b_id, TaskSetRecord)
        for f in ("name", "builder"):
            if getattr(a, f) != getattr(b, f):
                self.add(category="task-set", field=f, old=getattr(a, f), new=getattr(b, f))
        for arm in sorted(set(b.arms) - set(a.arms)):
            self.add(category="task-set", field="arm", change="added", new=arm)
        for arm in sorted(set(a.arms) - set(b.arms)):
            self.add(category="task-set", field="arm", change="removed", old=arm)
        na, nb = {p.task: p.n for p in a.pairs}, {p.task: p.n for p in b.pairs}
        for task in sorted(na.keys() | nb.keys()):
            if task not in na:
                self.add(
                    category="task-set", field="pair", change="added", new=f"{task} N={nb[task]}"
                )
            elif task not in nb:
                self.add(
                    category="task-set", field="pair", change="removed", old=f"{task} N={na[task]}"
                )
            elif na[task] != nb[task]:
                self.add(
                    category="task-set", field="pinned N", pair=task, old=na[task], new=nb[task]
                )

    # -- builds -----------------------------------------------------------------------------
    def set_build(self, a_id: ObjectId, b_id: ObjectId) -> None:
        a, b = self.store.get(a_id, SetBuild), self.store.get(b_id, SetBuild)

        def key(e: SetEntry) -> tuple[str, str, str]:
            return (e.pair, e.arm, e.arm_variant)

        ea, eb = {key(e): e for e in a.entries}, {key(e): e for e in b.entries}
        for k in [k for k in eb if k not in ea]:
            self.add(
                category="build",
                field="build",
                change="added",
                pair=k[0],
                arms=[arm_label(k[1], k[2])],
                new=f"version {eb[k].version}",
            )
        for k in [k for k in ea if k not in eb]:
            self.add(
                category="build",
                field="build",
                change="removed",
                pair=k[0],
                arms=[arm_label(k[1], k[2])],
                old=f"version {ea[k].version}",
            )
        common = [(ea[k], eb[k]) for k in ea if k in eb and ea[k].result != eb[k].result]
        if not common:
            return
        ids = list({i for x, y in common for i in (x.result, y.result)})
        results = dict(self.store.get_many(ids, BuildResult))
        # configs first for every pair: they say why the rest differs
        for x, y in common:
            if x.config != y.config:
                self.config(x, y)
        for x, y in common:
            self.build(
                x.pair, arm_label(x.arm, x.arm_variant), results[x.result], results[y.result]
            )

    def config(self, x: SetEntry, y: SetEntry) -> None:
        a = self.store.get(x.config, BuildConfig)
        b = self.store.get(y.config, BuildConfig)
        label = arm_label(x.arm, x.arm_variant)
        for f in BuildConfig.__struct_fields__:
            va, vb = getattr(a, f), getattr(b, f)
            if va == vb:
                continue
            if f == "version":
                self.add(
                    category="build-config",
                    field="cohort version",
                    pair=x.pair,
                    arms=[label],
                    old=va,
                    new=vb,
                )
                continue
            for path, old, new in _value_diff(f, _builtins(va), _builtins(vb)):
                self.add(
                    category="build-config",
                    field=path,
                    pair=x.pair,
                    arms=[label],
                    old=old,
                    new=new,
                    change=_change(old, new),
                )

    def build(self, pair: str, label: str, a: BuildResult, b: BuildResult) -> None:
        if a.content != b.content and self.once(a.content, b.content):
            self.content(pair, a.content, b.content)
        if a.answer_key != b.answer_key and self.once(a.answer_key, b.answer_key):
            self.answers(pair, a.answer_key, b.answer_key)
        if a.atoms != b.atoms:
            self.atoms(pair, label, a.atoms, b.atoms)

    def content(self, pair: str, a_id: ObjectId, b_id: ObjectId) -> None:
        a, b = self.store.get(a_id, Content), self.store.get(b_id, Content)
        self.patients(pair, a.patients, b.patients)
        shown = more = 0
        for p in a.patients:
            ta, tb = a.evidence.get(p), b.evidence.get(p)
            if tb is None:
                continue  # left the cohort: named by the patients' difference
            time_a, time_b = a.prediction_times.get(p), b.prediction_times.get(p)
            if ta == tb and time_a == time_b:
                continue
            self.evidence_named.add((pair, p))
            if self.limit is not None and shown >= self.limit:
                more += 1
                continue
            shown += 1
            if time_a != time_b:
                self.add(
                    category="evidence",
                    field="prediction time",
                    pair=pair,
                    patient=p,
                    old=time_a,
                    new=time_b,
                )
            if ta is not None and ta != tb:
                self.evidence(pair, p, [], ta, tb)
        if more:
            self.add(
                category="evidence",
                field="evidence",
                pair=pair,
                note=f"and {more} more patients whose evidence or prediction time differs",
            )

    def evidence(self, pair: str, patient: str, arms: list[str], a: ObjectId, b: ObjectId) -> None:
        for c in diff_trees(self.store, a, b):
            self.add(
                category="evidence",
                field=f"evidence {c.path}",
                pair=pair,
                arms=arms,
                patient=patient,
                change="changed" if c.change == "modified" else c.change,
                old=c.old.hex() if c.old else None,
                new=c.new.hex() if c.new else None,
            )

    def patients(self, pair: str, a: Sequence[str], b: Sequence[str]) -> None:
        sa, sb = set(a), set(b)
        added = [p for p in b if p not in sa]
        removed = [p for p in a if p not in sb]
        for change, names in (("added", added), ("removed", removed)):
            if not names:
                continue
            shown = names if self.limit is None else names[: self.limit]
            rest = len(names) - len(shown)
            value = ", ".join(shown) + (f" and {rest} more" if rest else "")
            self.add(
                category="patients",
                field="patients",
                pair=pair,
                change=change,
                **({"new": value} if change == "added" else {"old": value}),
                note=f"{len(names)} patients",
            )

    def answers(self, pair: str, a_id: ObjectId, b_id: ObjectId) -> None:
        a, b = self.store.get(a_id, AnswerKey), self.store.get(b_id, AnswerKey)
        if a.targets != b.targets:
            self.add(
                category="answers",
                field="targets",
                pair=pair,
                old=list(a.targets),
                new=list(b.targets),
            )
        shown = more = 0
        for p, va in a.values.items():
            vb = b.values.get(p)
            if vb is None or va == vb:
                continue  # a patient only in A is named by the patients' difference
            for target in sorted(va.keys() | vb.keys()):
                if va.get(target) == vb.get(target):
                    continue
                if self.limit is not None and shown >= self.limit:
                    more += 1
                    continue
                shown += 1
                self.add(
                    category="answers",
                    field=f"answer {target}",
                    pair=pair,
                    patient=p,
                    old=va.get(target),
                    new=vb.get(target),
                )
        if more:
            self.add(
                category="answers",
                field="answers",
                pair=pair,
                note=f"and {more} more answers that changed",
            )

    def atoms(self, pair: str, label: str, a: Sequence[ObjectId], b: Sequence[ObjectId]) -> None:
        sa, sb = set(a), set(b)
        ga = dict(self.store.get_many([x for x in a if x not in sb], AtomTask))
        gb = dict(self.store.get_many([x for x in b if x not in sa], AtomTask))
        by_a = {t.patient: t for t in ga.values()}
        by_b = {t.patient: t for t in gb.values()}
        # one line per distinct change, counting the atom tasks that share it
        shared: dict[tuple[str, str, str], list[str]] = {}
        values: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        for p, x in by_a.items():
            y = by_b.get(p)
            if y is None:
                continue  # the patient left the cohort: named by the content's difference
            if x.instruction != y.instruction and self.once(x.instruction, y.instruction):
                self.instruction(pair, label, x.instruction, y.instruction)
            if x.evidence != y.evidence and (pair, p) not in self.evidence_named:
                self.evidence(pair, p, [label], x.evidence, y.evidence)
            for f in ("families", "environment", "submission_path"):
                va, vb = _builtins(getattr(x, f)), _builtins(getattr(y, f))
                for path, old, new in _value_diff(f, va, vb):
                    k = (path, _fmt(old), _fmt(new))
                    shared.setdefault(k, []).append(p)
                    values[k] = (old, new)
            if x.format_check != y.format_check and self.once(x.format_check, y.format_check):
                self.format_check(pair, label, x.format_check, y.format_check)
        for k, patients in shared.items():
            old, new = values[k]
            one = len(patients) == 1
            self.add(
                category="atom",
                field=k[0],
                pair=pair,
                arms=[label],
                old=old,
                new=new,
                patient=patients[0] if one else "",
                note="" if one else f"{len(patients)} atom tasks",
            )

    def instruction(self, pair: str, label: str, a_id: ObjectId, b_id: ObjectId) -> None:
        a = self.store.read_blob(a_id).decode(errors="replace").splitlines()
        b = self.store.read_blob(b_id).decode(errors="replace").splitlines()
        matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                continue
            old = "\n".join(a[i1:i2]) or None
            new = "\n".join(b[j1:j2]) or None
            self.add(
                category="instruction",
                field=f"instruction line {i1 + 1}",
                pair=pair,
                arms=[label],
                old=old,
                new=new,
                change=_change(old, new),
            )

    def format_check(self, pair: str, label: str, a_id: ObjectId, b_id: ObjectId) -> None:
        a, b = self.store.get(a_id, FormatCheck), self.store.get(b_id, FormatCheck)
        for path, old, new in _value_diff(
            "format check", _builtins(a.targets), _builtins(b.targets)
        ):
            self.add(category="atom", field=path, pair=pair, arms=[label], old=old, new=new)

    # -- jobs -------------------------------------------------------------------------------
    def jobs(self, a: Sequence[ObjectId], b: Sequence[ObjectId]) -> None:
        """Match the jobs of A and B: the same job in both first, then by agent name, arm
        and repetition, then (an agent swapped for another) by arm and repetition alone
        when that is unambiguous. What is left was run by one result only."""
        store = self.store
        jobs = dict(store.get_many(list(dict.fromkeys([*a, *b])), JobRecord))
        agents = dict(
            store.get_many(list(dict.fromkeys(j.agent_config for j in jobs.values())), AgentConfig)
        )
        both = set(a) & set(b)
        ka, kb = self._keyed(a, both, jobs, agents), self._keyed(b, both, jobs, agents)
        pairs = [(ka.pop(k), kb.pop(k)) for k in list(ka) if k in kb]
        by_slot_a: dict[tuple[str, str, int], list[_JobKey]] = {}
        by_slot_b: dict[tuple[str, str, int], list[_JobKey]] = {}
        for k in ka:
            by_slot_a.setdefault(k[1:], []).append(k)
        for k in kb:
            by_slot_b.setdefault(k[1:], []).append(k)
        for slot, ks in by_slot_a.items():
            if len(ks) == 1 and len(by_slot_b.get(slot, [])) == 1:
                pairs.append((ka.pop(ks[0]), kb.pop(by_slot_b[slot][0])))
        for k, jid in ka.items():
            self.add(
                category="jobs",
                field="job",
                change="removed",
                job=_job_label(k),
                old=jobs[jid].name,
                note=f"agent config {short(jobs[jid].agent_config)}",
            )
        for k, jid in kb.items():
            self.add(
                category="jobs",
                field="job",
                change="added",
                job=_job_label(k),
                new=jobs[jid].name,
                note=f"agent config {short(jobs[jid].agent_config)}",
            )
        # an agent config (or runner) change is named once per agent, not once per job
        uses: Counter[tuple[ObjectId, ObjectId]] = Counter(
            (jobs[x].agent_config, jobs[y].agent_config) for x, y in pairs
        )
        for (ca, cb), n in uses.items():
            if ca != cb:
                self.agent_config(agents[ca], agents[cb], n)
        runners: Counter[tuple[str, str, str]] = Counter(
            (agents[jobs[x].agent_config].name, jobs[x].runner, jobs[y].runner) for x, y in pairs
        )
        for (name, ra, rb), n in runners.items():
            if ra != rb:
                self.add(
                    category="runner",
                    field="runner",
                    agent=name,
                    old=ra,
                    new=rb,
                    note=_jobs_note(n),
                )
        labels = {jid: _job_label(k) for k, jid in self._keyed(a, set(), jobs, agents).items()}
        for x, y in sorted(pairs, key=lambda p: labels[p[0]]):
            self.runs(labels[x], jobs[x], jobs[y])

    @staticmethod
    def _keyed(
        ids: Sequence[ObjectId],
        skip: set[ObjectId],
        jobs: dict[ObjectId, JobRecord],
        agents: dict[ObjectId, AgentConfig],
    ) -> dict[_JobKey, ObjectId]:
        """(agent name, arm, variant, repetition) -> job; a second config of one agent name
        in a result is told apart by a suffix (``baseline#2``)."""
        out: dict[_JobKey, ObjectId] = {}
        for jid in dict.fromkeys(ids):
            if jid in skip:
                continue
            j = jobs[jid]
            name = agents[j.agent_config].name
            k: _JobKey = (name, j.arm, j.arm_variant, j.repetition)
            n = 1
            while k in out:
                n += 1
                k = (f"{name}#{n}", j.arm, j.arm_variant, j.repetition)
            out[k] = jid
        return out

    def agent_config(self, a: AgentConfig, b: AgentConfig, jobs: int) -> None:
        for path, old, new in _value_diff("", _builtins(a), _builtins(b)):
            self.add(
                category="agent-config",
                field=path,
                agent=a.name,
                old=old,
                new=new,
                change=_change(old, new),
                note=_jobs_note(jobs),
            )

    def runs(self, label: str, a: JobRecord, b: JobRecord) -> None:
        """What the runs of two matched jobs report, read only where their runs differ."""
        if a.runs == b.runs:
            return
        sa, sb = set(a.runs), set(b.runs)
        only_a = [r for _, r in self.store.get_many([r for r in a.runs if r not in sb], RunRecord)]
        only_b = [r for _, r in self.store.get_many([r for r in b.runs if r not in sa], RunRecord)]
        n = f"in the runs that differ: {len(only_a)} of A's, {len(only_b)} of B's"
        served_a = Counter(r.served_model or "(not reported)" for r in only_a)
        served_b = Counter(r.served_model or "(not reported)" for r in only_b)
        if served_a != served_b:
            self.add(
                category="served-model",
                field="served model",
                job=label,
                old=_hist(served_a, "runs"),
                new=_hist(served_b, "runs"),
                note=n,
            )
        enc_a = _encoders(only_a)
        enc_b = _encoders(only_b)
        if enc_a != enc_b:
            self.add(
                category="encoders",
                field="encoders served",
                job=label,
                old=sorted(enc_a) or None,
                new=sorted(enc_b) or None,
                note=n,
                change=_change(enc_a or None, enc_b or None),
            )
        atoms_a = {r.atom for r in only_a}
        atoms_b = {r.atom for r in only_b}
        reruns = len(atoms_a & atoms_b)
        moved = len(atoms_a - atoms_b)
        self.add(
            category="runs",
            field="runs",
            job=label,
            old=len(a.runs),
            new=len(b.runs),
            note=f"{len(only_b)} of B's runs are not A's: {moved} on atom tasks that changed, "
            f"{reruns} run again on an atom task that did not",
        )
        out_a = Counter(r.outcome for r in only_a)
        out_b = Counter(r.outcome for r in only_b)
        if out_a != out_b:
            self.add(
                category="runs",
                field="outcomes",
                job=label,
                old=_hist(out_a),
                new=_hist(out_b),
                note=n,
            )


def _change(old: Any, new: Any) -> str:
    return "added" if old is None else "removed" if new is None else "changed"


def _hist(c: Counter[str], unit: str = "") -> str:
    tail = f" {unit}" if unit else ""
    return ", ".join(f"{k} ({v}{tail})" for k, v in sorted(c.items()))


def _encoders(runs: list[RunRecord]) -> set[str]:
    return {f"{e.name} {e.version} {e.digest}" for r in runs for e in r.agent_block.encoders_served}


def _jobs_note(n: int) -> str:
    return f"{n} jobs" if n != 1 else ""


def _job_label(key: tuple[str, str, str, int]) -> str:
    agent, arm, variant, rep = key
    return f"{agent} {arm_label(arm, variant)} r{rep}"


def _merge(diffs: list[Difference]) -> list[Difference]:
    """One difference for the arms of a pair that share it (same field, same values)."""
    out: dict[tuple[Any, ...], Difference] = {}
    for d in diffs:
        k = (
            d.category,
            d.field,
            _fmt(d.old),
            _fmt(d.new),
            repr(d.old),
            repr(d.new),
            d.change,
            d.pair,
            d.patient,
            d.job,
            d.agent,
            d.note,
        )
        have = out.get(k)
        if have is None:
            out[k] = msgspec.structs.replace(d, arms=list(d.arms))
        else:
            have.arms.extend(a for a in d.arms if a not in have.arms)
    return sorted(out.values(), key=_order)


_RANK = {c: i for i, c in enumerate(CATEGORIES)}


def _order(d: Difference) -> tuple[int, str, int]:
    """Result and task set first, then pair by pair, then agents, then job by job: each
    place's differences together, in the order of `CATEGORIES` (a stable sort keeps the
    order they were found in within one)."""
    rank = _RANK.get(d.category, len(_RANK))
    if d.job:
        return (4, d.job, rank)
    if d.agent:
        return (3, d.agent, rank)
    if d.pair and d.category != "task-set":
        return (2, d.pair, rank)
    return (1, "", rank)


def diff_results(
    store: Store, a: str | ObjectId, b: str | ObjectId, *, limit: int | None = 50
) -> list[Difference]:
    """The inputs that differ between results ``a`` and ``b`` (ids, unique prefixes or ref
    names); empty exactly when they are the same result. ``limit``: per-patient lines per
    pair and kind before the rest are counted (None: every one)."""
    ida, ra = load_result(store, a)
    idb, rb = load_result(store, b)
    if ida == idb:
        return []
    d = _Differ(store, limit)
    d.result(ra, rb)
    out = _merge(d.out)
    if not out:
        # every input the same: only the scores themselves can differ (another scorer run)
        out.append(
            Difference(
                category="result",
                field="score rows",
                old=len(ra.rows),
                new=len(rb.rows),
                note="every input is the same",
            )
        )
    return out


def render_text(diffs: list[Difference]) -> list[str]:
    if not diffs:
        return ["no differences"]
    return [d.text() for d in diffs]
