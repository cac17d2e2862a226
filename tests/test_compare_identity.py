"""Golden vector for the comparison record kind: the same record must keep the same id forever.

If this fails, a change altered the canonical bytes of ``medomni.comparison``: undo it, or
give the new encoding a new kind version. Never regenerate the value.
"""

from __future__ import annotations

from medomni_cas.bench.comparisons import Comparison, ContrastRow
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes

L = ObjectId(bytes(range(32)))
M = ObjectId(bytes(range(32, 64)))
ROW = ContrastRow(
    agent="baseline",
    kind="arms",
    a="encoders",
    b="no-perception",
    pair="synth-ehr_ckd-staging@n20",
    target="ckd_stage",
    metric="macro_f1",
    higher_is_better=True,
    value_a=0.75,
    value_b=0.5,
    difference=0.25,
    ci_low=0.125,
    ci_high=0.375,
    patients=20,
    reps_a=1,
    reps_b=1,
    excluded=1,
    excluded_why={"evidence differs": 1},
    test="mcnemar-exact",
    p_value=0.0625,
    p_holm=0.125,
    discordant=5,
    a_better=5,
    config_a="aa" * 32,
    config_b="bb" * 32,
    families_a=("demographics", "ecg"),
)
SAMPLE = Comparison(
    task_set=L,
    set_build=M,
    jobs=(L, M),
    answer_keys=(M,),
    answer_columns=(L,),
    comparer="medomni-compare",
    comparer_version="1.0.0",
    n_boot=1000,
    seed=0,
    asked=(("encoders", "no-perception"),),
    rows=(ROW,),
    table=M,
)
GOLDEN = "df9c0ee82b072f737d3480205781dbd213a06f558d62999a5d5d6c134e6d5f95"


def test_comparison_golden_vector() -> None:
    assert Comparison.__kind__ == "medomni.comparison"
    assert hash_bytes(encoding.encode(SAMPLE)).hex() == GOLDEN


def test_defaults_are_left_out_of_the_bytes() -> None:
    """An optional field at its default is not in the bytes: adding one later keeps ids."""
    bare = ContrastRow(
        agent="a", kind="arms", a="x", b="y", pair="p", target="t", metric="accuracy",
        higher_is_better=True, value_a=None, value_b=None, difference=None, patients=0,
        reps_a=1, reps_b=1, config_a="", config_b="",
    )  # fmt: skip
    assert b"excluded_why" not in encoding.encode(
        Comparison(
            task_set=L, set_build=M, jobs=(), answer_keys=(), answer_columns=(), comparer="c",
            comparer_version="1", n_boot=0, seed=0, rows=(bare,), table=M,
        )
    )  # fmt: skip
