"""Task sets and benchmarks: a set only grows, publish (configs only) holds no data,
rebuild compares ids pair by pair, sign-off freezes a template, plug-ins are found."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import medomni_cas as mc
from examples import synth
from medomni_cas.store.bundle import read_bundle_header
from medomni_cas.studio.build import build_pair
from medomni_cas.studio.errors import VersionError
from medomni_cas.studio.folders import load_template
from medomni_cas.studio.records import AnswerKey, BuildResult, Content, TaskSetRecord
from medomni_cas.studio.refnames import task_set_ref
from medomni_cas.studio.signoff import signoff
from medomni_cas.studio.tasksets import TaskSetError, build_set, publish, rebuild, show_set

EXAMPLES = Path(__file__).parent.parent / "examples"
CKD = "synth-ehr_ckd-staging"
SET = "medomni-bench/v1"
CONFIG_KINDS = {
    "medomni.published-set",
    "medomni.task-set",
    "medomni.benchmark",
    "medomni.build-config",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    synth.generate(root / "data", patients=150, seed=0)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of the example studio and bench folders."""
    shutil.copytree(EXAMPLES / "studio", tmp_path / "studio", ignore=shutil.ignore_patterns("data"))
    shutil.copytree(EXAMPLES / "bench", tmp_path / "bench")
    return tmp_path


@pytest.fixture(scope="module")
def built(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[mc.Store, Path]:
    store = mc.open("memory://")
    build_set(store, SET, studio=EXAMPLES / "studio", bench=EXAMPLES / "bench", data_root=data)
    return store, tmp_path_factory.mktemp("pub")


def _set_file(tree: Path) -> Path:
    return tree / "bench/benchmarks/medomni-bench/sets/v1.yaml"


def _edit_set(tree: Path, fn) -> None:  # type: ignore[no-untyped-def]
    path = _set_file(tree)
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _build(store: mc.Store, tree: Path, data: Path, name: str = SET):  # type: ignore[no-untyped-def]
    return build_set(store, name, studio=tree / "studio", bench=tree / "bench", data_root=data)


# -- building and recording --------------------------------------------------------------------
def test_set_build_covers_every_pair_arm_and_rung(built: tuple[mc.Store, Path]) -> None:
    store, _ = built
    view = show_set(store, SET)
    assert view.record.builder == "medomni-v1" and len(view.record.pairs) == 4
    arms = {(e.pair, e.arm) for e in view.entries}
    for pair in (f"{CKD}@n20", f"{CKD}@n50"):
        assert {(pair, a) for a in ("encoders", "no-perception", "encoders-required")} <= arms
    # the ladder is rendered on its ladder cohort (n20), six rungs
    rungs = sorted(
        e.arm_variant for e in view.entries if e.pair == f"{CKD}@n20" and e.arm == "modality-ladder"
    )
    assert rungs == [f"r{i}" for i in range(1, 7)]
    assert not any(e.arm == "modality-ladder" for e in view.entries if e.pair.endswith("@n50"))
    assert store.refs[task_set_ref(SET)] == view.task_set


def test_building_again_writes_nothing(built: tuple[mc.Store, Path], data: Path) -> None:
    store, _ = built
    before = sum(1 for _ in store.iter_ids())
    again = build_set(
        store, SET, studio=EXAMPLES / "studio", bench=EXAMPLES / "bench", data_root=data
    )
    assert again.cached and sum(1 for _ in store.iter_ids()) == before
    assert again.task_set == show_set(store, SET).task_set


def test_the_hash_ignores_order_and_covers_pairs_and_n(tree: Path, data: Path) -> None:
    store = mc.open("memory://")
    first = _build(store, tree, data).task_set
    _edit_set(tree, lambda d: d["pairs"].reverse())
    _edit_set(tree, lambda d: d["arms"].reverse())
    _edit_set(tree, lambda d: d.update(description="reworded"))
    assert _build(store, tree, data).task_set == first


def test_a_set_only_grows(tree: Path, data: Path) -> None:
    store = mc.open("memory://")
    first = _build(store, tree, data).task_set
    # dropping a pair is refused, and nothing moves
    _edit_set(tree, lambda d: d["pairs"].pop())
    with pytest.raises(TaskSetError, match="synth-ehr_hba1c-next@n50 was dropped"):
        _build(store, tree, data)
    assert store.refs[task_set_ref(SET)] == first
    # dropping an arm is refused
    shutil.copy(EXAMPLES / "bench/benchmarks/medomni-bench/sets/v1.yaml", _set_file(tree))
    _edit_set(tree, lambda d: d["arms"].remove("encoders"))
    with pytest.raises(TaskSetError, match="arm encoders was dropped"):
        _build(store, tree, data)
    # growing is allowed: a set with fewer pairs first, then the full one
    store2 = mc.open("memory://")
    _edit_set(tree, lambda d: d["arms"].append("encoders"))
    full = yaml.safe_load(_set_file(tree).read_text())
    _edit_set(tree, lambda d: d.update(pairs=d["pairs"][:2]))
    small = _build(store2, tree, data).task_set
    _set_file(tree).write_text(yaml.safe_dump(full))
    grown = _build(store2, tree, data).task_set
    assert grown != small and store2.refs[task_set_ref(SET)] == grown
    assert len(store2.get(grown, TaskSetRecord).pairs) == 4


def test_a_new_n_enters_only_a_new_set(tree: Path, data: Path) -> None:
    store = mc.open("memory://")
    _build(store, tree, data)
    cohort = tree / "studio/datasets/synth-ehr/tasks" / CKD / "cohorts/n20.yaml"
    text = cohort.read_text()
    cohort.write_text(text.replace('version: "1.0"', 'version: "2.0"'))
    assert 'version: "2.0"' in cohort.read_text()
    _edit_set(tree, lambda d: d["pairs"][0].update(n=2))
    with pytest.raises(TaskSetError, match=r"moved from N=1 to N=2.*new task set"):
        _build(store, tree, data)
    # the same pairs in a new set v2 are fine
    shutil.copy(_set_file(tree), _set_file(tree).with_name("v2.yaml"))
    built = _build(store, tree, data, "medomni-bench/v2")
    assert any(b.pair == f"{CKD}@n20" for b in built.builds)


def test_unknown_sets_and_names_are_clear(built: tuple[mc.Store, Path]) -> None:
    store, _ = built
    with pytest.raises(TaskSetError, match=r"no task set 'medomni-bench/v9'.*recorded: "):
        show_set(store, "medomni-bench/v9")
    with pytest.raises(KeyError, match="<benchmark>/<set>"):
        show_set(store, "v1")
    with pytest.raises(KeyError, match="no benchmark 'nope'"):
        build_set(store, "nope/v1", studio=EXAMPLES / "studio", bench=EXAMPLES / "bench")


# -- publish and rebuild -----------------------------------------------------------------------
def test_configs_only_bundle_holds_no_patient_data(built: tuple[mc.Store, Path]) -> None:
    store, out = built
    path = out / "configs.bundle"
    publish(store, SET, path, studio=EXAMPLES / "studio", bench=EXAMPLES / "bench")
    other = mc.open("memory://")
    from medomni_cas.store.bundle import import_bundle

    import_bundle(other, path)
    header = read_bundle_header(path)
    kinds = {other.kind(o) for o in other.iter_ids()}
    assert kinds <= CONFIG_KINDS, kinds - CONFIG_KINDS  # zero data objects: no blob, no tree
    assert header.objects == sum(1 for _ in other.iter_ids())
    # no patient key and no answer anywhere in the file's bytes
    raw = path.read_bytes()
    view = show_set(store, SET)
    result = store.get(view.entries[0].result, BuildResult)
    content = store.get(result.content, Content)
    key = store.get(result.answer_key, AnswerKey)
    for patient in content.patients:
        assert patient.encode() not in raw
    for oid in (result.answer_key, result.content, *result.atoms[:3]):
        assert oid not in raw  # ids appear only as text, never as links
    assert key.values  # (the key exists in the publisher's store)


def test_rebuild_from_own_data_matches(built: tuple[mc.Store, Path], data: Path) -> None:
    store, out = built
    path = out / "rebuild.bundle"
    publish(store, SET, path, studio=EXAMPLES / "studio", bench=EXAMPLES / "bench")
    mine = mc.open("memory://")
    name, rows = rebuild(
        mine, path, studio=EXAMPLES / "studio", bench=EXAMPLES / "bench", data_root=data
    )
    assert name == SET and rows and all(r.status == "match" for r in rows)
    assert len(rows) == len(show_set(store, SET).entries)


def test_rebuild_names_data_and_config_differences(
    built: tuple[mc.Store, Path], tmp_path: Path, tree: Path, data: Path
) -> None:
    store, out = built
    path = out / "diff.bundle"
    publish(store, SET, path, studio=EXAMPLES / "studio", bench=EXAMPLES / "bench")
    other_data = tmp_path / "other"
    synth.generate(other_data / "data", patients=150, seed=1)
    _name, rows = rebuild(
        mc.open("memory://"),
        path,
        studio=tree / "studio",
        bench=tree / "bench",
        data_root=other_data,
    )
    assert {r.status for r in rows} == {"data differs"}
    assert "atom tasks differ" in rows[0].detail
    # a rebuild builds from the published configs: one's own templates are not read ...
    tpl = tree / "studio/datasets/synth-ehr/tasks" / CKD / "template.yaml"
    tpl.write_text(tpl.read_text().replace("Estimate this", "Estimate, please, this"))
    _, rows = rebuild(mc.open("memory://"), path, studio=tree / "studio", data_root=data)
    assert {r.status for r in rows} == {"match"}
    # ... but one's own dataset card is, and another release of it is named
    ds = tree / "studio/datasets/synth-ehr/dataset.yaml"
    ds.write_text(ds.read_text().replace('release: "1.0.0"', 'release: "1.1.0"'))
    _, rows = rebuild(mc.open("memory://"), path, studio=tree / "studio", data_root=data)
    assert {r.status for r in rows} == {"config differs"}
    assert "dataset_release: published 1.0.0, your dataset.yaml 1.1.0" in rows[0].detail


def test_whole_publish_refused_for_credentialed_data(
    built: tuple[mc.Store, Path], tree: Path
) -> None:
    store, out = built
    ds = tree / "studio/datasets/synth-ehr/dataset.yaml"
    ds.write_text(ds.read_text().replace("credentialed: false", "credentialed: true"))
    assert "credentialed: true" in ds.read_text()
    with pytest.raises(TaskSetError, match=r"credentialed.*without --with-data"):
        publish(
            store,
            SET,
            out / "x.bundle",
            with_data=True,
            studio=tree / "studio",
            bench=tree / "bench",
        )
    assert not (out / "x.bundle").exists()
    info = publish(
        store,
        SET,
        out / "whole.bundle",
        with_data=True,
        studio=EXAMPLES / "studio",
        bench=EXAMPLES / "bench",
    )
    assert info.objects > 100


# -- sign-off ----------------------------------------------------------------------------------
def test_signed_off_template_needs_version_rises(tree: Path, data: Path) -> None:
    store = mc.open("memory://")
    studio = tree / "studio"
    folder_path = studio / "datasets/synth-ehr/tasks" / CKD
    rid = signoff(store, load_template(folder_path))
    assert store.refs[f"studio/signoff/{CKD}"] == rid
    tpl = folder_path / "template.yaml"
    tpl.write_text(tpl.read_text().replace("Estimate this", "Estimate, please, this"))
    with pytest.raises(VersionError, match=r"template\.agent \(signed off\).*2\.1"):
        build_pair(store, studio, CKD, "n50", data_root=data)  # n50 is at 2.0: X rises to 2.1
    with pytest.raises(VersionError):
        signoff(store, load_template(folder_path))  # re-signing needs the rise too
    for c in ("n20", "n50"):
        p = folder_path / "cohorts" / f"{c}.yaml"
        text = p.read_text()
        p.write_text(text.replace('version: "1.0"', 'version: "1.1"').replace('"2.0"', '"2.1"'))
    build_pair(store, studio, CKD, "n50", data_root=data)
    # a metric change is a comparability change: X is not enough
    tpl.write_text(tpl.read_text().replace("metric: macro_f1", "metric: accuracy"))
    with pytest.raises(VersionError, match=r"template\.targets.*2\.0"):
        build_pair(store, studio, CKD, "n50", data_root=data)


# -- plug-ins ----------------------------------------------------------------------------------
def test_plugin_arm_and_benchmark_end_to_end(data: Path) -> None:
    """The example plug-in distribution (installed by the Makefile) adds an arm and a
    benchmark through entry points only; its set builds like any other."""
    from medomni_cas.cli.plugins import collect

    found = collect()
    assert any(
        a["name"] == "checklist" and a["source"] == "medomni-example-arm" for a in found["arms"]
    )
    assert any(b["name"] == "medomni-v1:checklist" for b in found["arm builds"])
    assert any(b["name"] == "checklist-bench" for b in found["benchmarks"])
    store = mc.open("memory://")
    built = build_set(
        store, "checklist-bench/v1", studio=EXAMPLES / "studio", bench=None, data_root=data
    )
    arms = {b.arm for b in built.builds}
    assert arms == {"checklist", "no-perception"}
    check = next(b for b in built.builds if b.arm == "checklist")
    nop = next(b for b in built.builds if b.arm == "no-perception" and b.pair == check.pair)
    a, b = (store.get(x.result, BuildResult) for x in (check, nop))
    assert a.content == b.content  # same evidence, different instruction
    from medomni_cas.studio.records import AtomTask

    text = store.read_blob(store.get(a.atoms[0], AtomTask).instruction).decode()
    assert "checklist" in text
