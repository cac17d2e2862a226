"""Publishing defaults to the safe side: configs only, unless ``--with-data`` is asked for.

A set of one pair is built once per module in a workspace; ``medomni studio taskset
publish`` runs as the CLI runs it (in this process: `tests._cli.medomni_here`). Without a
flag (or with the old ``--configs-only``) the bundle holds no patient id and no answer, and
its manifest says ``configs-only``; only ``--with-data`` writes the answer keys, says so,
and is refused for credentialed data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store.bundle import export_bundle, read_bundle_header
from medomni_cas.studio.records import AnswerKey, BuildResult, Content
from medomni_cas.studio.tasksets import CONFIGS_ONLY, WITH_DATA, build_set, publish, show_set
from tests._cli import medomni_here
from tests._sets import small_tree

SET = "medomni-bench/small"
CKD = "synth-ehr_ckd-staging@n20"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("publish")
    tree = small_tree(root, arms=["no-perception"], pairs=(CKD,))
    (root / "workspace.yaml").write_text("store: lmdb://store\n")
    with mc.open(f"lmdb://{root / 'store'}") as store:
        build_set(store, SET, studio=tree / "studio", bench=tree / "bench")
    return root


def secrets(root: Path) -> list[bytes]:
    """The set's patient ids and answer key ids, as they would appear in a bundle's bytes."""
    with mc.open(f"lmdb://{root / 'store'}", create=False) as store:
        result = store.get(show_set(store, SET).entries[0].result, BuildResult)
        patients = store.get(result.content, Content).patients
        assert store.get(result.answer_key, AnswerKey).values
        return [p.encode() for p in patients] + [bytes(result.answer_key)]


def test_publish_without_a_flag_writes_configs_only(workspace: Path) -> None:
    out = workspace / "default.bundle"
    proc = medomni_here("studio", "taskset", "publish", SET, "-o", str(out), cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    assert "configs only" in proc.stdout
    raw = out.read_bytes()
    leaked = [s for s in secrets(workspace) if s in raw]
    assert leaked == []  # not one patient id, not the answer key
    assert read_bundle_header(out).manifest == {"holds": CONFIGS_ONLY, "task_set": SET}


def test_configs_only_is_still_accepted_and_means_the_default(workspace: Path) -> None:
    out = workspace / "old-flag.bundle"
    argv = ["studio", "taskset", "publish", SET, "-o", str(out), "--configs-only", "--json"]
    proc = medomni_here(*argv, cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["manifest"]["holds"] == CONFIGS_ONLY
    both = medomni_here(*argv[:-1], "--with-data", cwd=workspace)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_with_data_writes_the_answer_keys_and_says_so(workspace: Path) -> None:
    out = workspace / "whole.bundle"
    argv = ["studio", "taskset", "publish", SET, "-o", str(out), "--with-data"]
    proc = medomni_here(*argv, cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    assert "with data" in proc.stdout
    raw = out.read_bytes()
    assert all(s in raw for s in secrets(workspace))
    assert read_bundle_header(out).manifest == {"holds": WITH_DATA, "task_set": SET}


def test_with_data_is_refused_for_credentialed_data(workspace: Path) -> None:
    card = workspace / "studio/datasets/synth-ehr/dataset.yaml"
    text = card.read_text()
    card.write_text(text.replace("credentialed: false", "credentialed: true"))
    try:
        out = workspace / "refused.bundle"
        argv = ["studio", "taskset", "publish", SET, "-o", str(out), "--with-data"]
        proc = medomni_here(*argv, cwd=workspace)
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr.startswith("medomni: error: ") and "Traceback" not in proc.stderr
        assert "credentialed" in proc.stderr and "synth-ehr" in proc.stderr
        assert not out.exists()
    finally:
        card.write_text(text)


def test_the_python_function_has_the_same_default(workspace: Path) -> None:
    studio, bench = workspace / "studio", workspace / "bench"
    with mc.open(f"lmdb://{workspace / 'store'}", create=False) as store:
        safe = publish(store, SET, workspace / "py.bundle", studio=studio, bench=bench)
        assert safe.manifest["holds"] == CONFIGS_ONLY
        whole = publish(
            store, SET, workspace / "py-whole.bundle", with_data=True, studio=studio, bench=bench
        )
        assert whole.manifest["holds"] == WITH_DATA and whole.objects > safe.objects
        with pytest.raises(TypeError, match="configs_only"):
            publish(store, SET, workspace / "x.bundle", configs_only=False)  # type: ignore[call-arg]


def test_a_bundle_without_a_manifest_still_reads(tmp_path: Path) -> None:
    """Bundles written before manifests have none in their header: read as empty."""
    with mc.open("memory://") as store:
        oid = store.put_blob(b"old")
        info = export_bundle(store, [oid], tmp_path / "old.bundle")
    assert info.manifest == {} and read_bundle_header(tmp_path / "old.bundle").manifest == {}
    assert b"manifest" not in (tmp_path / "old.bundle").read_bytes()  # the header as it was
