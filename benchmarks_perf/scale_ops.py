"""The operations of ``python -m benchmarks_perf scale``, each run alone in a fresh process.

``python -m benchmarks_perf scale --child OP SPEC`` runs one operation on stores the
parent made (`SPEC`, a JSON file, says where they are and what to check) and prints one
JSON line: the operation's seconds (opening the store and reading the spec not counted),
its time on the CPU (user and system), its major page faults, its peak RSS (``VmHWM``:
the process's high-water mark, anonymous and mapped pages) and what it did (objects, rows,
slots), which the parent checks against what it built.

A process of its own per operation so that one operation's memory does not hide another's
(a high-water mark only grows), and so that nothing is warm but the page cache.
"""

from __future__ import annotations

import json
import re
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import medomni_cas as mc
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.ids import ObjectId

__all__ = ["OPS", "RAW", "run_child"]

Spec = dict[str, Any]


def _open(path: str) -> mc.Store:
    return mc.Store(LMDBBackend(Path(path), durable=False))


def _build(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.studio.build import build_pair

    store = mc.open(f"lmdb://{spec['store']}")

    def op() -> dict[str, int]:
        built = build_pair(
            store, spec["studio"], spec["template"], spec["cohort"], data_root=spec["data"]
        )
        return {"renders": len(built), "patients": int(spec["patients"])}

    return op


def _resume(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.bench.harness import resume

    store = _open(spec["store"])
    agent = ObjectId.from_hex(spec["agent"])
    jobs = [([ObjectId.from_hex(a) for a in atoms], arm, rep) for atoms, arm, rep in spec["jobs"]]

    def op() -> dict[str, int]:
        done = sum(resume(store, atoms, agent, arm, rep).done for atoms, arm, rep in jobs)
        return {"slots": done}

    return op


def _score(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.bench.scorer import score_jobs

    store = _open(spec["store"])
    jobs = [ObjectId.from_hex(j) for j in spec["jobs"]]

    def op() -> dict[str, int]:
        scored = score_jobs(store, jobs, n_boot=0, allow_partial=True)
        return {"rows": int(spec["rows"]), "score_rows": len(scored.record.rows)}

    return op


def _verify(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.audit.verify import verify_result

    store = _open(spec["store"])

    def op() -> dict[str, int]:
        report = verify_result(store, spec["result"], jobs=1)
        return {"objects": report.objects, "problems": len(report.problems)}

    return op


def _fsck(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.store.verify import REF_HISTORY, fsck

    store = _open(spec["store"])

    def op() -> dict[str, int]:
        report = fsck(store, jobs=1)
        history = sum(p.kind == REF_HISTORY for p in report.problems)
        return {
            "objects": report.objects,
            "problems": len(report.problems) - history,
            "history": history,
        }

    return op


def _gc(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.store.gc import gc

    store = _open(spec["store"])

    def op() -> dict[str, int]:
        report = gc(store, grace=0)
        return {
            "objects": report.reachable + report.swept + report.kept_young,
            "reachable": report.reachable,
            "swept": report.swept,
        }

    return op


def _push(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.store.sync import push

    local = _open(spec["store"])
    remote = mc.open(f"lmdb://{spec['other']}")

    def op() -> dict[str, int]:
        report = push(local, remote, [spec["ref"]])
        return {"objects": report.objects}

    return op


def _pull(spec: Spec) -> Callable[[], dict[str, int]]:
    from medomni_cas.store.sync import pull

    remote = _open(spec["store"])
    local = mc.open(f"lmdb://{spec['other']}")

    def op() -> dict[str, int]:
        report = pull(local, remote, [spec["ref"]])
        return {"objects": report.objects}

    return op


def _raw(spec: Spec) -> Callable[[], dict[str, int]]:
    """The reads an operation makes, by py-lmdb alone: each of ``spec["sections"]`` (a
    table, ``objects`` or ``refs``, and a file of its keys, each ``width`` bytes, in the
    order the operation reads them) in one read transaction; an object's bytes are hashed
    as the store checks them. What the medium costs, against which the op's time is put.
    With ``spec["dropped"]``, the mapped pages are looked at every 256 reads and dropped
    past the budget, as the store's reads do (`medomni_cas.store._mapped.each`): what the
    medium costs under verify's RSS bound."""
    import blake3

    from medomni_cas.store import _mapped
    from medomni_cas.store.backends.lmdb import _HDR, _INLINE

    backend = LMDBBackend(Path(spec["store"]), durable=False)
    tables = {"objects": backend._objects, "refs": backend._refs}
    sections = []
    for table, keys, width in spec["sections"]:
        data = Path(keys).read_bytes()
        sections.append((table, [data[i : i + width] for i in range(0, len(data), width)]))
    cut = _HDR.size
    dropped = bool(spec.get("dropped"))

    def op() -> dict[str, int]:
        reads = found = 0
        for table, keys in sections:
            with backend.env.begin(db=tables[table], buffers=False) as txn:
                values = _mapped.each(txn.get, keys) if dropped else list(map(txn.get, keys))
            reads += len(keys)
            if table == "objects":
                for key, value in zip(keys, values, strict=True):
                    if value is None:
                        continue
                    # a large object's value marks its file, read as the store reads it
                    data = value[cut:] if value[0] == _INLINE else backend._value(key, value)
                    if data is not None:
                        blake3.blake3(data).digest()
                        found += 1
            else:
                found += sum(v is not None for v in values)
        return {"reads": reads, "found": found}

    return op


#: op name -> what opens its stores (untimed) and returns the timed call
OPS: dict[str, Callable[[Spec], Callable[[], dict[str, int]]]] = {
    "build": _build,
    "resume": _resume,
    "score": _score,
    "verify": _verify,
    "fsck": _fsck,
    "gc": _gc,
    "push": _push,
    "pull": _pull,
}
#: a baseline, not an operation (``--baseline``): no ``--only`` of its own
RAW = _raw


def run_child(op: str, spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("modules"):
        import importlib

        for name in spec["modules"]:  # the kinds the stores hold
            importlib.import_module(name)
    call = RAW(spec) if op == "raw" else OPS[op](spec)
    before = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    did = call()
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_SELF)
    # pages read from the disk: a page the kernel took back from the page cache during the
    # run (DAMON's pageout here) is read again, and costs a larger store's run more
    faults = after.ru_majflt - before.ru_majflt
    # the time on the CPU: the wall time less what the run waited for (the disk, the
    # scheduler)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # VmHWM, not ru_maxrss: on Linux ru_maxrss keeps the parent's RSS at the fork (the
    # high-water mark of the memory image that exec replaced)
    status = Path("/proc/self/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    maxrss_kib = int(found[1]) if found else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {"seconds": seconds, "cpu": cpu, "maxrss_kib": maxrss_kib, "majflt": faults, **did}
        )
    )
    return 0
