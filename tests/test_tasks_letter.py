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
from medomni_cas.studio.folders import at_pins, load_set, load_studio
from medomni_cas.studio.records import AnswerKey, AtomTask, BuildConfig, BuildResult, Content

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
# Config hashes of the example's pairs as v1 pins them, from before issue 14 (data-free, so
# the same everywhere): v1 keeps its ids, whatever moved since. v2's, pinned since.
EXAMPLE_CONFIGS = "069440b4366c6a45e06dc98a7eeeba4d28fb78cad0ce794a17381b48181e757b"
EXAMPLE_CONFIGS_V2 = "c58ab4906202e09580b699b7e010991f5853210c263dc7cc78283a0764033758"


def _set_configs(set_name: str) -> str:
    """One hash of every config of every template's cohorts as set ``set_name`` pins them."""
    studio = load_studio(EXAMPLES / "studio")
    ts = load_set(EXAMPLES / "bench/benchmarks/medomni-bench/sets" / f"{set_name}.yaml")
    pins: dict[str, dict[str, int]] = {}
    for p in ts.pairs:
        pins.setdefault(p.template, {})[p.cohort] = p.n
    lines = []
    for name, loaded in sorted(studio.templates.items()):
        tf = at_pins(loaded, pins[name])
        for c in sorted(tf.cohorts):
            for arm in ("encoders", "no-perception", "encoders-required", "modality-ladder"):
                ab = arm_build(BUILDER, arm)
                if arm == "modality-ladder" and (tf.ladder is None or tf.ladder.cohort != c):
                    continue
                for v in ab.variants(tf):
                    cfg = config_for(tf, c, ab, v)
                    oid = mc.ObjectId.from_hex(blake3.blake3(_bytes(cfg)).hexdigest())
                    lines.append(f"{name}@{c} {arm} {v.name} {oid.hex()}")
    return blake3.blake3("\n".join(lines).encode()).hexdigest()


def test_the_example_configs_keep_their_ids() -> None:
    assert _set_configs("v1") == EXAMPLE_CONFIGS
    assert _set_configs("v2") == EXAMPLE_CONFIGS_V2
    # v1 pins n50 below its N and builds it from the file kept at N=1; v2 pins the new N
    studio = load_studio(EXAMPLES / "studio")
    n50 = studio.templates[CKD].cohorts["n50"]
    assert (str(n50.version), n50.selection) == ("2.0", "nested")
    assert str(studio.templates[CKD].kept["n50"][1].version) == "1.0"


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


def _set_results(capsys: pytest.CaptureFixture[str], name: str, data: Path) -> Any:
    built = cli_json(capsys, "studio", "taskset", "build", name, "--data-root", str(data))
    return built, {b["pair"].partition("@")[2]: b["result"] for b in built["builds"]}


def _classes(store_url: str, result: str) -> dict[str, str]:
    with mc.open(store_url) as store:
        res = store.get(mc.ObjectId.from_hex(result), BuildResult)
        key = store.get(res.answer_key, AnswerKey)
    return {p: str(v["ckd_stage"]) for p, v in key.values.items()}


def test_v2_puts_n20_first_in_n50_while_v1_keeps_its_ids(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    # the example's sets, on the CKD pairs, under one arm (the data-free configs of every
    # arm are pinned above); v2 first, so that v1 then builds beside a later N
    v1, v2 = ([(f"{CKD}@n20", 1), (f"{CKD}@n50", n)] for n in (1, 2))
    _write_set(ws, "v1", v1, ["no-perception"])
    _write_set(ws, "v2", v2, ["no-perception"])
    built2, new = _set_results(capsys, "medomni-bench/v2", data)
    assert built2["frozen"] == [] and new["n20"] == BUILT_BEFORE["n20"]
    store = "lmdb://.medomni/store"
    n20, nested = (list(_content(store, new[c]).patients) for c in ("n20", "n50"))
    assert nested[:20] == n20
    # for every class: n20's patients of the class are n50's first ones of it, in order
    classes = _classes(store, new["n50"])
    for cls in sorted(set(classes.values())):
        of = [p for p in nested if classes[p] == cls]
        mine = [p for p in n20 if classes[p] == cls]
        assert mine and of[: len(mine)] == mine, cls
    # v1 builds to the ids it was built to, from cohorts/N1/n50.yaml, and says it is frozen
    for _ in range(2):
        built1, old = _set_results(capsys, "medomni-bench/v1", data)
        assert old == BUILT_BEFORE
        kept = str(ws / TASKS / CKD / "cohorts/N1/n50.yaml")
        assert built1["frozen"] == [{"pair": f"{CKD}@n50", "n": 1, "version": "2.0", "kept": kept}]
    legacy = list(_content(store, old["n50"]).patients)
    assert set(legacy) == set(nested) and legacy[:20] != n20
    assert [legacy.index(p) for p in n20] == [*range(14), 16, 17, 18, 22, 23, 31]
    code, out, _ = cli(capsys, "studio", "taskset", "build", "medomni-bench/v1", "--data-root",
                       str(data))  # fmt: skip
    assert code == 0 and f"frozen at N=1 (its cohort file is at 2.0): built from {kept}" in out
    # and v2 again: unchanged, the later N's builds untouched by v1's
    assert _set_results(capsys, "medomni-bench/v2", data)[1] == new
    # the kept file cannot change without the version rise it needs, within its N
    _edit(ws / TASKS / CKD / "cohorts/N1/n50.yaml", "selection: first", "selection: nested")
    code, _, err = cli(capsys, "studio", "taskset", "build", "medomni-bench/v1", "--data-root",
                       str(data))  # fmt: skip
    assert code == 2 and "n50: cohort changed" in err and 'version: "2.0"' in err


def test_a_cohort_file_says_its_selection_where_the_rules_differ(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    """A new per-class cohort with a smaller one of the same recipe within it does not get
    the first rule silently: it is refused until it says which; ``first`` keeps the ids of
    a file built before ``nested`` existed, and the build notes what nesting would do."""
    kept = kept_n50()
    shutil.rmtree(ws / TASKS / CKD / "cohorts/N1")  # n20 and n40 alone: no nested n50
    _cohort(ws, CKD, "n50").unlink()
    n40 = _cohort(ws, CKD, "n40")
    n40.write_text(
        kept.replace("selection: first\n", "")
        .replace("n: 50", "n: 40")
        .replace("{G1: 9, G2: 9, G3a: 8, G3b: 8, G4: 8, G5: 8}", _counts(8, 8, 6))
    )
    code, _, err = cli(capsys, "studio", "task", "build", f"{CKD}@n40", "--data-root", str(data))
    assert code == 2 and f"{n40}:" in err and "selection" in err and "n20" in err
    assert "selection: nested" in err and "selection: first" in err
    # `first` builds, and says what `nested` would do; it encodes as no key (the old ids)
    _edit(n40, "seed: 0", "seed: 0\nselection: first")
    got = cli_json(capsys, "studio", "task", "build", f"{CKD}@n40", "--arm", "no-perception",
                   "--data-root", str(data))  # fmt: skip
    assert len(got["notes"]) == 1 and "n20 are within it, not its first" in got["notes"][0]
    assert "selection: nested" in got["notes"][0]
    with mc.open("lmdb://.medomni/store") as store:
        cfg = store.get(mc.ObjectId.from_hex(got["builds"][0]["config_hash"]), BuildConfig)
    assert "selection" not in cfg.cohort
    # the smallest cohort, or one without per-class counts, needs no word: the rules agree
    assert "selection" not in _cohort(ws, CKD, "n20").read_text()
    assert "selection" not in _cohort(ws, A1C, "n50").read_text()


def test_nested_without_a_new_n_is_refused(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    # n50 as built at 1.0 (the kept file, now the cohort's own), then nested at 1.1
    n50 = _cohort(ws, CKD, "n50")
    shutil.rmtree(ws / TASKS / CKD / "cohorts/N1")
    n50.write_text(kept_n50())
    assert _build(capsys, f"{CKD}@n50", data) == BUILT_BEFORE["n50"]
    _edit(n50, 'version: "1.0"', 'version: "1.1"')
    _edit(n50, "selection: first", "selection: nested")
    code, _, err = cli(
        capsys, "studio", "task", "build", f"{CKD}@n50", "--arm", "no-perception",
        "--data-root", str(data),
    )  # fmt: skip
    assert code == 2 and "n50: cohort changed" in err and 'version: "2.0"' in err
    _edit(n50, 'version: "1.1"', 'version: "2.0"')
    code, out, _ = cli(capsys, "studio", "task", "build", f"{CKD}@n50", "--data-root", str(data))
    assert code == 0 and "note:" not in out


def kept_n50() -> str:
    return (EXAMPLES / "studio/datasets/synth-ehr/tasks" / CKD / "cohorts/N1/n50.yaml").read_text()


def test_a_chain_of_three_nests_and_a_smaller_cohort_that_does_not_fit_is_refused(
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path
) -> None:
    n50 = _cohort(ws, CKD, "n50")
    assert "selection: nested" in n50.read_text()
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
    capsys: pytest.CaptureFixture[str], ws: Path, data: Path, tmp_path: Path, n50: int = 1
) -> tuple[Path, Any]:
    pairs = [(f"{CKD}@n20", 1), (f"{CKD}@n50", n50), (f"{A1C}@n20", 1)]
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
    bundle, built = _publish(capsys, ws, data, tmp_path, n50=2)
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
