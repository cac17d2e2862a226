"""A comparison between arms is attested like a result: its contrasts signed, re-derived
by verify-attestation, and a changed contrast in the statement named.

A world of one pair under two arms (the noisy oracle of `tests._compare_world`, in
process), compared once per module."""

from __future__ import annotations

import json
from typing import Any

import pytest

import medomni_cas as mc
from medomni_cas.audit import dsse
from medomni_cas.audit.attest import attest, verify_attestation
from medomni_cas.audit.keys import generate, keyid
from medomni_cas.cli import main
from tests._compare_world import NoisyOracle, truth_of
from tests._sets import small_tree

SET = "medomni-bench/pairwise"
ARMS = ["no-perception", "encoders"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    from medomni_cas import porcelain
    from medomni_cas.bench.agents import find_agent
    from medomni_cas.bench.harness import run_set
    from medomni_cas.studio.tasksets import build_set

    root = tmp_path_factory.mktemp("attest-compare")
    tree = small_tree(root, arms=ARMS, pairs=("synth-ehr_ckd-staging@n20",), name="pairwise")
    url = f"lmdb://{root / 'store'}"
    studio, bench = tree / "studio", tree / "bench"
    with mc.open(url) as store:
        build_set(store, SET, studio=studio, bench=bench)
        run_set(
            store, SET, find_agent(bench, "baseline"), runs_dir=root / "runs", studio=studio,
            bench=bench, runner=NoisyOracle(truth_of(store, SET)), arms=ARMS,
        )  # fmt: skip
        report = porcelain.compare(store, SET, n_boot=50)
    return url, report.comparison.hex()


def test_a_comparison_is_attested_and_its_contrasts_checked(
    world: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, cid = world
    key = generate()
    with mc.open(url, create=False) as store:
        done = attest(store, f"comparisons/{SET}", key)
        assert done.subject.hex() == cid and done.check.result == "PASSED"
        assert done.subject_name == f"comparisons/{SET}"
        assert done.ref == f"attestations/{SET}/comparison/{keyid(key.public_key())}"
        doc = json.loads(dsse.decode(done.envelope).payload)
        rows = doc["predicate"]["medomni"]["rows"]
        assert rows and {(r["a"], r["b"]) for r in rows} == {("encoders", "no-perception")}
        assert verify_attestation(done.envelope, key.public_key(), store).ok

        def lie(change: Any) -> bytes:
            d = json.loads(json.dumps(doc))
            change(d)
            return dsse.encode(dsse.sign(dsse.INTOTO_PAYLOAD_TYPE, json.dumps(d).encode(), key))

        def wider(d: dict[str, Any]) -> None:
            d["predicate"]["medomni"]["rows"][0]["difference"] = 0.5

        report = verify_attestation(lie(wider), key.public_key(), store)
        assert [p.part for p in report.problems] == ["predicate.medomni.rows[0].difference"]
        assert " - no-perception, pair" in report.problems[0].message
    capsys.readouterr()
    assert main(["audit", "show", f"comparisons/{SET}", "--store", url]) == 0
    assert done.ref in capsys.readouterr().out
