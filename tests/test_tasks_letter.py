"""The Tasks document, to the letter (issue 14, §8), each through `medomni studio …` on a
scratch copy of the example benchmark: a new N enters only a new set while the old set stays
frozen at its N; the patients of n20 are the first ones of n50; the evidence is the whole
record minus the targets' guards; tasks start at 1.0; a rebuild needs only the bundle and
one's own dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import blake3
import pytest
import yaml

import medomni_cas as mc
from examples import synth
from medomni_cas.cli.main import main
from medomni_cas.store import trees
from medomni_cas.studio.arms import BUILDER, arm_build
from medomni_cas.studio.build import config_for
from medomni_cas.studio.folders import load_studio
from medomni_cas.studio.records import AtomTask, BuildConfig, BuildResult, Content

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CKD, A1C = "synth-ehr_ckd-staging", "synth-ehr_hba1c-next"
TASKS = Path("studio/datasets/synth-ehr/tasks")
SETS = Path("bench/benchmarks/medomni-bench/sets")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated once: the folder holding the dataset's ``data/`` (a --data-root)."""
    root = tmp_path_factory.mktemp("synth")
    synth.generate(root / "data", patients=150, seed=0)
    return root


def _workspace(root: Path, pairs: list[tuple[str, int]], arms: list[str]) -> Path:
    """A copy of the example studio and bench whose v1 is ``pairs`` under ``arms``."""
    shutil.copytree(EXAMPLES / "studio", root / "studio", ignore=shutil.ignore_patterns("data"))
    shutil.copytree(EXAMPLES / "bench", root / "bench")
    _write_set(root, "v1", pairs, arms)
    (root / "workspace.yaml").write_text(
        "store: lmdb://.medomni/store\nstudio: studio\nbench: bench\n"
    )
    return root


def _write_set(root: Path, name: str, pairs: list[tuple[str, int]], arms: list[str]) -> None:
    doc = {"builder": BUILDER, "arms": arms, "pairs": [{"task": t, "n": n} for t, n in pairs]}
    (root / SETS / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path}"
    path.write_text(text.replace(old, new))


def _cohort(root: Path, template: str, cohort: str) -> Path:
    return root / TASKS / template / "cohorts" / f"{cohort}.yaml"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = _workspace(tmp_path / "ws", [(f"{CKD}@n20", 1), (f"{A1C}@n20", 1)], ["no-perception"])
    monkeypatch.chdir(root)
    return root


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> Any:
    got, out, err = cli(capsys, *argv, "--json")
    assert got == code, err or out
    return json.loads(out)


def _content(store_url: str, result: str) -> Content:
    with mc.open(store_url) as store:
        return store.get(store.get(mc.ObjectId.from_hex(result), BuildResult).content, Content)


# -- "A new N of a pair enters only a new task set" ---------------------------------------------
def test_a_new_n_builds_a_new_set_while_the_old_one_stays_frozen(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    dr = ("--data-root", str(data))
    first = cli_json(capsys, "studio", "taskset", "build", "medomni-bench/v1", *dr)
    shown = cli_json(capsys, "studio", "taskset", "show", "medomni-bench/v1")
    # ckd-staging@n20 moves to 2.0 (its cohort changed), and v2 pins it at N=2
    n20 = _cohort(ws, CKD, "n20")
    _edit(n20, 'version: "1.0"', 'version: "2.0"')
    _edit(n20, "offset_days: 1", "offset_days: 2")
    _write_set(ws, "v2", [(f"{CKD}@n20", 2), (f"{A1C}@n20", 1)], ["no-perception"])
    v2 = cli_json(capsys, "studio", "taskset", "build", "medomni-bench/v2", *dr)
    assert {b["pair"] for b in v2["builds"]} == {f"{CKD}@n20", f"{A1C}@n20"}
    assert v2["task_set"] != first["task_set"]
    # v1 keeps its last build, and says it is frozen at N=1 (nothing changed: exit 0)
    again = cli_json(capsys, "studio", "taskset", "build", "medomni-bench/v1", *dr)
    assert again["frozen"] == [{"pair": f"{CKD}@n20", "n": 1, "version": "2.0"}]
    assert (again["task_set"], again["build"]) == (first["task_set"], first["build"])
    assert cli_json(capsys, "studio", "taskset", "show", "medomni-bench/v1") == shown
    code, out, _ = cli(capsys, "studio", "taskset", "build", "medomni-bench/v1", *dr)
    assert code == 0 and f"{CKD}@n20" in out and "frozen at N=1" in out
    # an X rise of another pair still reaches the frozen set; the frozen pair stays
    _edit(ws / TASKS / A1C / "template.yaml", "The record ends", "The patient's record ends")
    _edit(_cohort(ws, A1C, "n20"), 'version: "1.0"', 'version: "1.1"')
    risen = cli_json(capsys, "studio", "taskset", "build", "medomni-bench/v1", *dr)
    assert risen["task_set"] == first["task_set"] and risen["build"] != first["build"]
    after = cli_json(capsys, "studio", "taskset", "show", "medomni-bench/v1")
    versions = {e["pair"]: e["version"] for e in after["entries"]}
    assert versions == {f"{CKD}@n20": "1.0", f"{A1C}@n20": "1.1"}
    ckd = [e for e in after["entries"] if e["pair"].startswith(CKD)]
    assert ckd == [e for e in shown["entries"] if e["pair"].startswith(CKD)]
    shown = after
    # asking to change the frozen set (grow it) is refused, naming the set and the pair
    _write_set(
        ws, "v1", [(f"{CKD}@n20", 1), (f"{A1C}@n20", 1), (f"{A1C}@n50", 1)], ["no-perception"]
    )
    code, _, err = cli(capsys, "studio", "taskset", "build", "medomni-bench/v1", *dr)
    assert code == 2 and "medomni-bench/v1" in err and f"{CKD}@n20" in err
    assert "frozen at N=1" in err
    assert cli_json(capsys, "studio", "taskset", "show", "medomni-bench/v1") == shown


def test_a_frozen_set_with_no_build_here_says_where_to_get_one(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    _edit(_cohort(ws, CKD, "n20"), 'version: "1.0"', 'version: "2.0"')
    code, _, err = cli(
        capsys, "studio", "taskset", "build", "medomni-bench/v1", "--data-root", str(data)
    )
    assert code == 2 and "frozen at N=1" in err and "rebuild" in err
    assert "v1.yaml" in err and "pairs[0].n" in err


# -- "the patients of n20 are the first ones of n50" --------------------------------------------
# Config hashes of the example's pairs before issue 14 (data-free, so the same everywhere):
# the cohort files as they are keep their ids, whatever the new selection rule does.
EXAMPLE_CONFIGS = "069440b4366c6a45e06dc98a7eeeba4d28fb78cad0ce794a17381b48181e757b"


def test_the_example_configs_keep_their_ids() -> None:
    studio = load_studio(EXAMPLES / "studio")
    lines = []
    for name, tf in sorted(studio.templates.items()):
        for c in sorted(tf.cohorts):
            for arm in ("encoders", "no-perception", "encoders-required", "modality-ladder"):
                ab = arm_build(BUILDER, arm)
                if arm == "modality-ladder" and (tf.ladder is None or tf.ladder.cohort != c):
                    continue
                for v in ab.variants(tf):
                    cfg = config_for(tf, c, ab, v)
                    oid = mc.ObjectId.from_hex(blake3.blake3(_bytes(cfg)).hexdigest())
                    lines.append(f"{name}@{c} {arm} {v.name} {oid.hex()}")
    assert blake3.blake3("\n".join(lines).encode()).hexdigest() == EXAMPLE_CONFIGS


def _bytes(cfg: BuildConfig) -> bytes:
    from medomni_cas.store import encoding

    return encoding.encode(cfg)


# The no-perception builds of the example's CKD cohorts on `data`, made before issue 14.
BUILT_BEFORE = {
    "n20": "66525aece75c4828a41e6d9de0be4d4104891d0c16f06ff326948c24e15a8155",
    "n50": "575943f0774721932a23d6a04e07e94bc3b0b548485cffe0855089be0ad94fd3",
}


def _build(capsys: pytest.CaptureFixture[str], pair: str, data: Path) -> str:
    built = cli_json(
        capsys, "studio", "task", "build", pair, "--arm", "no-perception", "--data-root", str(data)
    )
    return str(built["builds"][0]["result"])


def _patients(capsys: pytest.CaptureFixture[str], pair: str, data: Path) -> list[str]:
    result = _build(capsys, pair, data)
    return list(_content("lmdb://.medomni/store", result).patients)


def test_n20_is_the_first_twenty_of_n50_under_the_nested_rule(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    # the files as they are keep the rule they were built with, and so their ids: n20 is
    # within n50 (here at positions 0-13, 16-18, 22, 23 and 31), not its first twenty
    results = {c: _build(capsys, f"{CKD}@{c}", data) for c in ("n20", "n50")}
    assert results == BUILT_BEFORE
    n20, legacy = (list(_content("lmdb://.medomni/store", results[c]).patients) for c in results)
    assert [legacy.index(p) for p in n20] == [*range(14), 16, 17, 18, 22, 23, 31]
    # and the build says so, with the line that would change it
    again = cli_json(capsys, "studio", "task", "build", f"{CKD}@n50", "--arm", "no-perception",
                     "--data-root", str(data))  # fmt: skip
    assert len(again["notes"]) == 1 and "n20 are within it, not its first" in again["notes"][0]
    assert "selection: nested" in again["notes"][0]
    # `selection: nested` changes the order: without a new N it is refused, naming the field
    n50 = _cohort(ws, CKD, "n50")
    _edit(n50, 'version: "1.0"', 'version: "1.1"\nselection: nested')
    code, _, err = cli(
        capsys, "studio", "task", "build", f"{CKD}@n50", "--arm", "no-perception",
        "--data-root", str(data),
    )  # fmt: skip
    assert code == 2 and "n50: cohort changed" in err and 'version: "2.0"' in err
    # at 2.0, n20 is the first twenty of n50: the same patients, n20's in its own order first
    _edit(n50, 'version: "1.1"', 'version: "2.0"')
    nested = _patients(capsys, f"{CKD}@n50", data)
    assert nested[:20] == n20 and set(nested) == set(legacy)
    code, out, _ = cli(capsys, "studio", "task", "build", f"{CKD}@n50", "--data-root", str(data))
    assert code == 0 and "note:" not in out


def test_a_chain_of_three_nests_and_a_smaller_cohort_that_does_not_fit_is_refused(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    n50 = _cohort(ws, CKD, "n50")
    _edit(n50, 'version: "1.0"', 'version: "1.0"\nselection: nested')
    n30 = n50.with_name("n30.yaml")
    text = n50.read_text().replace("n: 50", "n: 30")
    n30.write_text(text.replace("{G1: 9, G2: 9, G3a: 8, G3b: 8, G4: 8, G5: 8}", _counts(5, 5, 5)))
    n20 = _patients(capsys, f"{CKD}@n20", data)
    p30 = _patients(capsys, f"{CKD}@n30", data)
    p50 = _patients(capsys, f"{CKD}@n50", data)
    assert p30[:20] == n20 and p50[:30] == p30
    # a smaller cohort of the same recipe with more of one class than n30 cannot be its prefix
    n20_path = _cohort(ws, CKD, "n20")
    _edit(
        n20_path,
        "{G1: 4, G2: 4, G3a: 3, G3b: 3, G4: 3, G5: 3}",
        "{G1: 7, G2: 3, G3a: 3, G3b: 3, G4: 2, G5: 2}",
    )
    code, _, err = cli(
        capsys, "studio", "task", "build", f"{CKD}@n30", "--arm", "no-perception",
        "--data-root", str(data),
    )  # fmt: skip
    assert code == 2 and "n30.yaml" in err and "selection" in err and "n20" in err


def _counts(big: int, mid: int, small: int) -> str:
    return f"{{G1: {big}, G2: {mid}, G3a: {small}, G3b: {small}, G4: {small}, G5: {small}}}"


# -- "the evidence is the patient's whole record minus the targets' guards" ----------------------
def test_input_is_a_record_and_the_evidence_is_the_whole_record(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    tpl = ws / TASKS / CKD / "template.yaml"
    (ws / TASKS / CKD / "arms/modality-ladder.yaml").unlink()  # its rungs name medications
    _edit(tpl, "labs, medications]", "labs]")
    _edit(tpl, "labs, medications, ecg]", "labs, ecg]")
    built = cli_json(
        capsys, "studio", "task", "build", f"{CKD}@n20", "--arm", "encoders",
        "--data-root", str(data),
    )  # fmt: skip
    with mc.open("lmdb://.medomni/store") as store:
        result = store.get(mc.ObjectId.from_hex(built["builds"][0]["result"]), BuildResult)
        atom = store.get(result.atoms[0], AtomTask)
        files = {name: oid for name, oid, _kind, _size in trees.ls_tree(store, atom.evidence)}
        cfg = store.get(result.config, BuildConfig)
        labs = store.read_blob(files["labs.jsonl"])
    assert "medications" in atom.families and "medications.jsonl" in files
    assert set(atom.families) == {
        "demographics",
        "encounters",
        "vitals",
        "labs",
        "medications",
        "ecg",
    }
    assert cfg.template["input"]["families"] == [
        "demographics",
        "encounters",
        "vitals",
        "labs",
        "ecg",
    ]
    # the guards still cut: no eGFR or creatinine row reaches the atom
    assert b"eGFR" not in labs and b"creatinine" not in labs


# -- "Tasks start at 1.0" -----------------------------------------------------------------------
def test_a_version_below_1_0_is_refused(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    n20 = _cohort(ws, CKD, "n20")
    _edit(n20, 'version: "1.0"', 'version: "0.9"')
    code, _, err = cli(capsys, "studio", "task", "build", f"{CKD}@n20", "--data-root", str(data))
    assert code == 2 and f"{n20}:1: version: " in err and "start at 1.0" in err
    _edit(n20, 'version: "0.9"', 'version: "1.0"')
    _write_set(ws, "v1", [(f"{CKD}@n20", 0)], ["no-perception"])
    code, _, err = cli(
        capsys, "studio", "taskset", "build", "medomni-bench/v1", "--data-root", str(data)
    )
    assert code == 2 and "v1.yaml" in err and "pairs[0].n" in err and "1.0" in err
    assert not (ws / ".medomni").exists()


# -- "taskset rebuild BUNDLE" from the bundle and one's own dataset --------------------------------
def test_rebuild_needs_only_the_bundle_and_ones_own_dataset(
    capsys: pytest.CaptureFixture[str],
    ws: Path,
    data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundle, built = _publish(capsys, ws, data, tmp_path)
    # the rebuilder: only a dataset card (and data); no workspace, templates, sets or bench
    mine = _own_dataset(tmp_path)
    monkeypatch.chdir(mine)
    store = f"lmdb://{mine}/store"
    rebuilt = cli_json(
        capsys, "studio", "taskset", "rebuild", str(bundle), "--store", store,
        "--studio", str(mine / "studio"), "--data-root", str(data),
    )  # fmt: skip
    assert rebuilt["ok"] and {p["status"] for p in rebuilt["pairs"]} == {"match"}
    assert len(rebuilt["pairs"]) == len(built["builds"])
    # the set is now recorded in the rebuilder's store, ready to run
    shown = cli_json(capsys, "studio", "taskset", "show", "medomni-bench/v1", "--store", store)
    assert shown["task_set"] == built["task_set"] and shown["build"] == built["build"]
    # someone else's data: the ids differ and the exit code says so
    other = tmp_path / "other"
    synth.generate(other / "data", patients=150, seed=3)
    code, out, _ = cli(
        capsys, "studio", "taskset", "rebuild", str(bundle), "--store", f"lmdb://{tmp_path}/o",
        "--dataset", str(mine / DATASET), "--data-root", str(other),
    )  # fmt: skip
    assert code == 1 and "data differs" in out
    # a dataset card of another release is a config that differs, named
    card = mine / DATASET / "dataset.yaml"
    _edit(card, 'release: "1.0.0"', 'release: "1.1.0"')
    code, out, _ = cli(
        capsys, "studio", "taskset", "rebuild", str(bundle), "--store", f"lmdb://{tmp_path}/r",
        "--dataset", str(mine / DATASET), "--data-root", str(data),
    )  # fmt: skip
    assert code == 1 and "config differs" in out and "dataset_release" in out


def _publish(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path, tmp_path: Path
) -> tuple[Path, Any]:
    pairs = [(f"{CKD}@n20", 1), (f"{CKD}@n50", 1), (f"{A1C}@n20", 1)]
    _write_set(ws, "v1", pairs, ["no-perception", "modality-ladder"])
    built = cli_json(
        capsys, "studio", "taskset", "build", "medomni-bench/v1", "--data-root", str(data)
    )
    bundle = tmp_path / "v1.bundle"
    cli_json(
        capsys, "studio", "taskset", "publish", "medomni-bench/v1", "-o", str(bundle),
        "--configs-only",
    )  # fmt: skip
    return bundle, built


def _own_dataset(tmp_path: Path) -> Path:
    """``mine/``, holding only ``studio/datasets/synth-ehr/dataset.yaml`` (no workspace)."""
    mine = tmp_path / "mine"
    (mine / "studio/datasets/synth-ehr").mkdir(parents=True)
    shutil.copy(EXAMPLES / "studio/datasets/synth-ehr/dataset.yaml", mine / DATASET)
    return mine


DATASET = Path("studio/datasets/synth-ehr")


def test_rebuild_rederives_the_selection_rule_its_configs_name(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path, tmp_path: Path
) -> None:
    """A nested cohort's config carries what the rule needs (the smaller cohorts' counts),
    so the rebuild, which has no cohort files, puts n20's patients first again."""
    _edit(_cohort(ws, CKD, "n50"), 'version: "1.0"', 'version: "1.0"\nselection: nested')
    bundle, built = _publish(capsys, ws, data, tmp_path)
    mine = _own_dataset(tmp_path)
    store = f"lmdb://{mine}/store"
    rebuilt = cli_json(
        capsys, "studio", "taskset", "rebuild", str(bundle), "--store", store,
        "--dataset", str(mine / DATASET), "--data-root", str(data),
    )  # fmt: skip
    assert rebuilt["ok"] and len(rebuilt["pairs"]) == len(built["builds"])
    by_pair = {b["pair"]: b["result"] for b in built["builds"] if b["arm"] == "no-perception"}
    n20 = _content(store, by_pair[f"{CKD}@n20"]).patients
    n50 = _content(store, by_pair[f"{CKD}@n50"]).patients
    assert n50[:20] == n20
