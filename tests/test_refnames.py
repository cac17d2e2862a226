"""Ref names: each layer's namespace module makes the names stores already hold (names on
disk are forever), and its docstring's table lists every prefix it makes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from medomni_cas.bench import refnames as bench_refs
from medomni_cas.store.ids import ObjectId
from medomni_cas.studio import refnames as studio_refs

A = ObjectId(bytes(range(32)))
B = ObjectId(bytes(range(32, 64)))


def test_bench_names_are_the_ones_on_disk() -> None:
    assert bench_refs.slot_ref(A) == f"runs/slots/{A.hex()}"
    assert bench_refs.claim_ref(A) == f"runs/claims/{A.hex()}"
    assert bench_refs.slot_of_claim(bench_refs.claim_ref(A)) == A
    assert bench_refs.slot_of_claim("runs/claims/not-hex") is None
    # written by the harness before the namespace had a module of its own
    key = "b984e95a872b1d30652d4c5c090715f591150b9d6d02713ee954fe87580d8031"
    assert bench_refs.job_ref(A, B, "encoders.x", 2) == f"runs/jobs/{key}"
    assert bench_refs.job_name_ref(A, B, "encoders.x", 2) == f"runs/job-names/{key}"
    assert bench_refs.job_ref(A, B, "encoders.x", 1) != bench_refs.job_ref(A, B, "encoders.x", 2)
    assert bench_refs.agent_ref("baseline") == "bench/agents/baseline"
    assert bench_refs.result_ref("medomni-bench/v1") == "results/medomni-bench/v1"
    assert bench_refs.answers_ref(A, "modality-ladder.r1") == (
        f"scores/answers/{A.hex()}/modality-ladder.r1"
    )


def test_studio_names_are_the_ones_on_disk() -> None:
    assert studio_refs.task_set_ref("medomni-bench/v1") == "tasksets/medomni-bench/v1"
    assert studio_refs.set_build_ref("medomni-bench/v1") == "studio/sets/medomni-bench/v1"
    assert studio_refs.pair_ref("t@c", "encoders") == "studio/pairs/t@c/encoders"
    assert studio_refs.pair_ref("t@c", "modality-ladder", "r1") == (
        "studio/pairs/t@c/modality-ladder.r1"
    )
    assert studio_refs.build_cache_ref(A, "d1g") == f"studio/builds/{A.hex()}/d1g"
    assert studio_refs.signoff_ref("t") == "studio/signoff/t"
    assert studio_refs.published_ref("medomni-bench/v1") == "published/medomni-bench/v1"


@pytest.mark.parametrize("module", [bench_refs, studio_refs], ids=["bench", "studio"])
def test_the_namespace_table_lists_every_prefix(module: object) -> None:
    prefixes = {n: v for n, v in vars(module).items() if n.endswith("_REFS")}
    assert prefixes and set(prefixes) <= set(module.__all__)  # type: ignore[attr-defined]
    doc = module.__doc__ or ""
    missing = [p for p in prefixes.values() if f"\n    {p}" not in doc]
    assert not missing, f"not in the namespace table: {missing}"


def test_studio_names_need_no_bench() -> None:
    """Studio never imports Bench: its namespace is a module of its own."""
    code = "import sys, medomni_cas.studio.refnames; print(any('.bench' in m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
