"""The harness's checks of a set before anything runs; a failed one stops the whole run.

* Built tasks: every atom's closure is present and re-hashes to its id, and its format check
  is readable.
* Stand-in agents on each task: a null answer must fail the format check; the oracle's answer
  (the answer key's values, given from outside the task) must pass it and score perfectly.
* Routes: the agent's route against each dataset's policy (deny refuses; conditional needs
  ``accept_conditions``), and a local route's endpoint must resolve to this machine or a
  private network.
* The card: the agent's intelligence kind must be one the benchmark's card accepts.
* The runs folder keeps POSIX permissions.

What the runner needs (its own `Runner.check`) is asked by `run_set` once the jobs are planned.
"""

from __future__ import annotations

import os
from pathlib import Path

from medomni_cas.bench.records import AgentConfig
from medomni_cas.bench.routes import check_endpoint
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.verify import verify_closure
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.benchmarks import find_benchmarks, read_card, split_set_name
from medomni_cas.studio.folders import load_dataset
from medomni_cas.studio.records import (
    AnswerKey,
    AtomTask,
    BuildConfig,
    BuildResult,
    FormatCheck,
    SetEntry,
)

__all__ = [
    "CheckFailed",
    "check_built",
    "check_card",
    "check_posix_permissions",
    "check_routes",
    "oracle_answer",
]


class CheckFailed(MedomniError):
    """The set failed its checks; nothing was run. ``problems`` lists every one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} check(s) failed; nothing was run:\n  {shown}{more}")


def check_posix_permissions(folder: Path) -> None:
    """Refuse a runs folder whose file system ignores permissions (exFAT, FAT, some mounts):
    Harbor sets them in job folders, and a run folder must keep them."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".medomni-perm-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        os.chmod(probe, 0o640)
        ok = (os.stat(probe).st_mode & 0o777) == 0o640
        os.chmod(probe, 0o600)
        ok = ok and (os.stat(probe).st_mode & 0o777) == 0o600
    except OSError:
        ok = False
    finally:
        probe.unlink(missing_ok=True)
    if not ok:
        raise MedomniError(
            f"runs folder {folder}: its file system does not keep POSIX permissions (exFAT or "
            "FAT?); set `runs:` in workspace.yaml to a folder on ext4, xfs, btrfs or apfs"
        )


def oracle_answer(key: AnswerKey, atom: AtomTask, check: FormatCheck) -> dict[str, object] | None:
    """The oracle's answer to ``atom``: its patient's value of each target in the answer key,
    which the oracle is handed from outside the task (no other agent ever is); None when the
    key has no answer for the patient."""
    truth = key.values.get(atom.patient)
    if truth is None:
        return None
    return {t.name: truth.get(t.name) for t in check.targets}


def check_built(
    store: Store, entries: list[SetEntry], problems: list[str]
) -> dict[ObjectId, list[tuple[ObjectId, AtomTask]]]:
    """Check every build; return each build's atoms in order, read once for the planning."""
    loaded: dict[ObjectId, list[tuple[ObjectId, AtomTask]]] = {}
    results = [e.result for e in entries]
    report = verify_closure(store, results)
    problems += [f"built tasks: {p}" for p in (str(x) for x in report.problems)]
    if report.problems:
        return loaded
    for e in entries:
        result = store.get(e.result, BuildResult)
        key = store.get(result.answer_key, AnswerKey)
        atoms = dict(store.get_many(result.atoms, AtomTask))
        loaded[e.result] = [(aid, atoms[aid]) for aid in result.atoms]
        checks: dict[ObjectId, FormatCheck] = {}
        for aid in result.atoms:
            atom = atoms[aid]
            check = checks.get(atom.format_check)
            if check is None:
                check = checks[atom.format_check] = store.get(atom.format_check, FormatCheck)
            where = f"{e.pair} {arm_label(atom.arm, atom.arm_variant)}"
            if not check.targets:
                problems.append(f"{where}: atom {aid}: the format check names no target")
                continue
            # stand-ins: the null agent must fail the format check
            if not check.problems({}):
                problems.append(f"{where}: atom {aid}: an empty answer passes the format check")
            # the oracle must pass it and be right
            oracle = oracle_answer(key, atom, check)
            if oracle is None:
                problems.append(f"{where}: patient {atom.patient} has no answer in the key")
                continue
            truth = key.values[atom.patient]
            bad = check.problems(oracle)
            if bad:
                problems.append(f"{where}: atom {aid}: the oracle's answer fails: {bad[0]}")
            elif any(oracle[t] != truth.get(t) for t in oracle):
                problems.append(f"{where}: atom {aid}: the oracle does not score perfectly")
    return loaded


def check_routes(
    store: Store,
    entries: list[SetEntry],
    agent: AgentConfig,
    studio: Path | None,
    accept_conditions: bool,
    problems: list[str],
    notices: list[str],
) -> None:
    """The agent's route against the policy of each dataset the entries read, and a local
    route's endpoint against where it resolves to (`medomni_cas.bench.routes`)."""
    check_endpoint(agent, problems)
    datasets = sorted({store.get(e.config, BuildConfig).dataset for e in entries})
    for ds_name in datasets:
        folder = studio / "datasets" / ds_name if studio is not None else None
        if folder is None or not (folder / "dataset.yaml").is_file():
            problems.append(
                f"route: no dataset.yaml for {ds_name} in the studio folder, so its route "
                "policy cannot be checked"
            )
            continue
        route = getattr(load_dataset(folder).routes, agent.route)
        if route.policy == "deny":
            problems.append(f"route: dataset {ds_name} denies the {agent.route} route")
        elif route.policy == "conditional":
            text = " ".join(route.conditions.split())
            if accept_conditions:
                notices.append(f"dataset {ds_name}, {agent.route} route: you accepted: {text}")
            else:
                problems.append(
                    f"route: dataset {ds_name} allows the {agent.route} route only if: {text} "
                    "(run again with --accept-conditions if you meet them)"
                )


def check_card(
    set_name: str,
    agent: AgentConfig,
    bench: Path | None,
    problems: list[str],
    notices: list[str],
) -> None:
    """The agent's intelligence kind against the card of the set's benchmark: its
    ``benchmark.yaml`` in ``bench`` (the bench folder) or a plug-in's, which must list it in
    ``intelligence_kinds``. A card found nowhere cannot be checked, and says so."""
    name, _ = split_set_name(set_name)
    found = find_benchmarks(bench).get(name)
    if found is None:
        where = f"{bench / 'benchmarks'}/ or plug-ins" if bench is not None else "plug-ins"
        notices.append(
            f"card: no benchmark.yaml for {name} in {where}, so the intelligence kinds it "
            "accepts were not checked"
        )
        return
    kinds = read_card(found.path).intelligence_kinds
    if agent.kind not in kinds:
        problems.append(
            f"card: {found.path / 'benchmark.yaml'}: intelligence_kinds accepts "
            f"{', '.join(kinds)}, not agent config {agent.name}'s kind {agent.kind!r}"
        )
