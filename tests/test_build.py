"""Build: the spec's invariants on the example studio and generated synthetic data."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import medomni_cas as mc
from examples import synth
from medomni_cas.store import trees
from medomni_cas.studio.arms import ArmError, arm_descriptions
from medomni_cas.studio.build import build_pair
from medomni_cas.studio.errors import VersionError
from medomni_cas.studio.records import AnswerKey, AtomTask, BuildResult, Content, FormatCheck
from medomni_cas.studio.schema import SpecError

EXAMPLES = Path(__file__).parent.parent / "examples"
CKD, A1C = "synth-ehr_ckd-staging", "synth-ehr_hba1c-next"
PATIENTS = 150  # enough eligible patients per class for n50


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    synth.generate(root / "data", patients=PATIENTS, seed=0)
    return root


@pytest.fixture(scope="module")
def built(data: Path) -> tuple[mc.Store, dict[str, list]]:
    store = mc.open("memory://")
    out = {
        f"{t}@{c}": build_pair(store, EXAMPLES / "studio", t, c, data_root=data)
        for t in (CKD, A1C)
        for c in ("n20", "n50")
    }
    return store, out


def _atoms(store: mc.Store, result: mc.ObjectId) -> list[AtomTask]:
    return [store.get(a, AtomTask) for a in store.get(result, BuildResult).atoms]


def _by_arm(builds: list) -> dict[str, BuildResult]:
    return {f"{b.arm}.{b.variant}".rstrip("."): b for b in builds}


def _count(store: mc.Store) -> int:
    return sum(1 for _ in store.iter_ids())


def _studio(tmp_path: Path) -> Path:
    dst = tmp_path / "studio"
    shutil.copytree(EXAMPLES / "studio", dst, ignore=shutil.ignore_patterns("data"))
    return dst


def test_no_atom_reaches_an_answer(built: tuple[mc.Store, dict[str, list]]) -> None:
    store, out = built
    for builds in out.values():
        for b in builds:
            result = store.get(b.result, BuildResult)
            key = store.get(result.answer_key, AnswerKey)
            content = store.get(result.content, Content)
            for atom_id in result.atoms:
                atom = store.get(atom_id, AtomTask)
                closure = store.closure(atom_id)
                assert result.answer_key not in closure and result.content not in closure
                assert all(store.kind(o) != "medomni.answer-key" for o in closure)
                answers = key.values[atom.patient]
                pt = dt.datetime.fromisoformat(atom.prediction_time)
                for name, oid, _ in trees.iter_tree(store, atom.evidence):
                    if name != "labs.jsonl":
                        continue
                    for line in store.read_blob(oid).splitlines():
                        row = msgspec.json.decode(line)
                        assert dt.datetime.fromisoformat(row["time"]) < pt
                        if "ckd_stage" in answers:  # eGFR values and creatinine are guarded
                            assert row["test"] != "creatinine"
                            assert row["test"] != "eGFR" or row["value"] is None
                assert content.prediction_times[atom.patient] == atom.prediction_time


def test_ckd_answers_are_nowhere_in_the_text_files(
    built: tuple[mc.Store, dict[str, list]],
) -> None:
    store, out = built
    b = out[f"{CKD}@n50"][0]
    key = store.get(store.get(b.result, BuildResult).answer_key, AnswerKey)
    classes = {v["ckd_stage"] for v in key.values.values()}
    assert len(classes) == 6
    for atom in _atoms(store, b.result):
        for name, oid, _ in trees.iter_tree(store, atom.evidence):
            if name.endswith((".jsonl", ".json")):
                text = store.read_blob(oid)
                assert not any(f'"{c}"'.encode() in text for c in classes), name


def test_encoder_arms_share_evidence_and_differ_only_in_instruction(
    built: tuple[mc.Store, dict[str, list]],
) -> None:
    store, out = built
    arms = _by_arm(out[f"{CKD}@n20"])
    enc, nop, req = (_atoms(store, arms[a].result) for a in ENCODER_ARMS)
    assert len({arms[a].config for a in ENCODER_ARMS}) == 3
    same = ("pair", "version", "patient", "prediction_time", "evidence", "families")
    for a, b, c in zip(enc, nop, req, strict=True):
        for f in same:
            assert getattr(a, f) == getattr(b, f) == getattr(c, f), f
        assert len({a.instruction, b.instruction, c.instruction}) == 3
    results = [store.get(arms[a].result, BuildResult) for a in ENCODER_ARMS]
    assert len({(r.content, r.answer_key) for r in results}) == 1
    texts = [store.read_blob(enc[0].instruction).decode(), store.read_blob(nop[0].instruction)]
    assert "perception:8899" in texts[0] and b"No encoders" in texts[1]


ENCODER_ARMS = ("encoders", "no-perception", "encoders-required")


def test_ladder_rungs_differ_only_in_masked_families(
    built: tuple[mc.Store, dict[str, list]],
) -> None:
    store, out = built
    arms = _by_arm(out[f"{CKD}@n20"])
    rungs = [_atoms(store, arms[f"modality-ladder.r{i}"].result) for i in range(1, 7)]
    full = _atoms(store, arms["encoders"].result)
    families = {"patients.jsonl": "demographics", "encounters.jsonl": "encounters"}
    families |= {"vitals.jsonl": "vitals", "labs.jsonl": "labs", "medications.jsonl": "medications"}
    families |= {"ecg.signal.npy": "ecg", "ecg.attrs.json": "ecg"}
    for p, whole in enumerate(full):
        everything = dict(store.get(whole.evidence))
        prev: set[str] = set()
        for i, rung in enumerate(rungs, start=1):
            atom = rung[p]
            assert atom.arm_variant == f"r{i}" and atom.patient == whole.patient
            entries = dict(store.get(atom.evidence))
            assert set(entries) > prev  # each rung adds
            assert {families[n] for n in entries} == set(atom.families)
            assert all(everything[n] == oid for n, oid in entries.items())  # same files
            prev = set(entries)
        assert rungs[-1][p].evidence == whole.evidence
    assert rungs[0][0].families == ("demographics",)


def test_n20_is_within_n50(built: tuple[mc.Store, dict[str, list]]) -> None:
    store, out = built
    for t in (CKD, A1C):
        n20, n50 = (
            store.get(store.get(out[f"{t}@{c}"][0].result, BuildResult).content, Content)
            for c in ("n20", "n50")
        )
        assert len(n20.patients) == 20 and len(n50.patients) == 50
        assert set(n20.patients) < set(n50.patients)
        for p in n20.patients:  # and the same evidence
            assert n20.evidence[p] == n50.evidence[p]


def test_deterministic_across_stores_and_rebuild_writes_nothing(
    built: tuple[mc.Store, dict[str, list]], data: Path, tmp_path: Path
) -> None:
    _, out = built
    with mc.open(f"lmdb://{tmp_path}/lmdb") as other:
        again = build_pair(other, EXAMPLES / "studio", CKD, "n20", data_root=data)
        assert [b.result for b in again] == [b.result for b in out[f"{CKD}@n20"]]
        assert not any(b.cached for b in again)
        count, refs = _count(other), other.refs.as_dict()
        logs = {n: len(other.refs.history(n)) for n in refs}
        third = build_pair(other, EXAMPLES / "studio", CKD, "n20", data_root=data)
        assert all(b.cached for b in third)
        assert [b.result for b in third] == [b.result for b in again]
        assert _count(other) == count and other.refs.as_dict() == refs
        assert {n: len(other.refs.history(n)) for n in refs} == logs


def test_patient_data_changes_atoms_not_configs(
    built: tuple[mc.Store, dict[str, list]], tmp_path: Path
) -> None:
    store, out = built
    synth.generate(tmp_path / "data", patients=PATIENTS, seed=1)
    old = out[f"{CKD}@n20"]
    s2 = mc.open("memory://")
    new = build_pair(s2, EXAMPLES / "studio", CKD, "n20", data_root=tmp_path)
    assert [b.config for b in new] == [b.config for b in old]
    new_atoms = set(s2.get(new[0].result, BuildResult).atoms)
    assert not new_atoms & set(store.get(old[0].result, BuildResult).atoms)


def test_instruction_wording_needs_a_higher_x(data: Path, tmp_path: Path) -> None:
    studio = _studio(tmp_path)
    store = mc.open("memory://")
    first = build_pair(store, studio, A1C, "n20", arms=["encoders"], data_root=data)
    tpl = studio / f"datasets/synth-ehr/tasks/{A1C}/template.yaml"
    tpl.write_text(tpl.read_text().replace("The record ends", "The patient's record ends"))
    count = _count(store)
    with pytest.raises(VersionError) as e:
        build_pair(store, studio, A1C, "n20", arms=["encoders"], data_root=data)
    assert e.value.field == "template" and e.value.needed == "1.1"
    assert "template changed" in str(e.value) and '"1.1"' in str(e.value)
    assert _count(store) == count  # refused before writing anything
    cohort = studio / f"datasets/synth-ehr/tasks/{A1C}/cohorts/n20.yaml"
    cohort.write_text(cohort.read_text().replace('version: "1.0"', 'version: "1.1"'))
    second = build_pair(store, studio, A1C, "n20", arms=["encoders"], data_root=data)
    assert second[0].config != first[0].config
    # the pair's other cohort was never built here; a fresh store shows its config moved too
    fresh = build_pair(mc.open("memory://"), studio, A1C, "n50", arms=["encoders"], data_root=data)
    orig = build_pair(
        mc.open("memory://"), EXAMPLES / "studio", A1C, "n50", arms=["encoders"], data_root=data
    )
    assert fresh[0].config != orig[0].config


def test_cohort_change_needs_a_higher_n(data: Path, tmp_path: Path) -> None:
    studio = _studio(tmp_path)
    store = mc.open("memory://")
    build_pair(store, studio, A1C, "n20", arms=["no-perception"], data_root=data)
    cohort = studio / f"datasets/synth-ehr/tasks/{A1C}/cohorts/n20.yaml"
    text = cohort.read_text().replace("offset_days: -1", "offset_days: -2")
    for version in ("1.0", "1.1"):
        cohort.write_text(text.replace('version: "1.0"', f'version: "{version}"'))
        with pytest.raises(VersionError) as e:
            build_pair(store, studio, A1C, "n20", arms=["no-perception"], data_root=data)
        assert e.value.field == "cohort" and e.value.needed == "2.0"
    cohort.write_text(text.replace('version: "1.0"', 'version: "2.0"'))
    (b,) = build_pair(store, studio, A1C, "n20", arms=["no-perception"], data_root=data)
    assert store.get(b.result, BuildResult).version == "2.0"


def test_unsupported_arms_are_refused(data: Path) -> None:
    store = mc.open("memory://")
    with pytest.raises(ArmError, match=r"unknown arm 'bogus'.*it builds: encoders"):
        build_pair(store, EXAMPLES / "studio", CKD, "n20", arms=["bogus"], data_root=data)
    with pytest.raises(ArmError, match="builds on cohort 'n20', not 'n50'"):
        build_pair(store, EXAMPLES / "studio", CKD, "n50", arms=["modality-ladder"], data_root=data)
    assert _count(store) == 0
    assert set(arm_descriptions()) >= {"encoders", "no-perception", "encoders-required"}


def test_bad_files_get_clear_errors(data: Path, tmp_path: Path) -> None:
    studio = _studio(tmp_path)
    store = mc.open("memory://")
    folder = studio / f"datasets/synth-ehr/tasks/{CKD}"
    with pytest.raises(SpecError, match=r"cohorts.*no cohort 'n99' \(n20, n50\)"):
        build_pair(store, studio, CKD, "n99", data_root=data)
    cohort = folder / "cohorts/n20.yaml"
    cohort.write_text(cohort.read_text().replace("G5: 3}", "G9: 3}"))
    with pytest.raises(SpecError, match=r"n20.yaml:\d+: per_class.counts: no class 'G9'"):
        build_pair(store, studio, CKD, "n20", data_root=data)
    tpl = folder / "template.yaml"
    tpl.write_text(tpl.read_text().replace("metric: macro_f1", "metric: f1"))
    with pytest.raises(SpecError, match=r"template.yaml:\d+: targets\[0\].metric: unknown metric"):
        build_pair(store, studio, CKD, "n20", data_root=data)
    assert _count(store) == 0


def test_format_check_checks_shape_only(built: tuple[mc.Store, dict[str, list]]) -> None:
    store, out = built
    atom = _atoms(store, out[f"{CKD}@n20"][0].result)[0]
    check = store.get(atom.format_check, FormatCheck)
    assert check.problems({"ckd_stage": "G2"}) == []
    assert check.problems({"ckd_stage": "G7"}) == [
        "ckd_stage: 'G7' is not one of G5, G4, G3b, G3a, G2, G1"
    ]
    assert check.problems({}) == ["ckd_stage: missing"]
    a1c = _atoms(store, out[f"{A1C}@n20"][0].result)[0]
    num = store.get(a1c.format_check, FormatCheck)
    assert num.problems({"hba1c_next": 7.1}) == []
    assert num.problems({"hba1c_next": "7.1", "x": 1}) == [
        "unknown target 'x'",
        "hba1c_next: '7.1' is not a number",
    ]


def test_signoff_needs_no_build() -> None:
    """`VersionError` lives in studio.errors: the sign-off check raises it without importing
    Build (the two modules imported each other)."""
    code = (
        "import sys, medomni_cas.studio.signoff as s, medomni_cas.studio.errors as e; "
        "print(s.VersionError is e.VersionError, 'medomni_cas.studio.build' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
