"""The store record of a comparison between arms: `Comparison`, its `ContrastRow`\\ s.

A comparison is derived, like a `Result`: it links every job it read, the answer keys and
answer columns it was computed against, and says which code computed it
(``comparer``/``comparer_version``), with what (``n_boot``, ``seed``, the contrasts and
agents asked for), so ``medomni audit verify`` computes it again and names what differs.
Kind name ``medomni.comparison`` is forever once released (golden vector in
``tests/test_compare_identity.py``).

Each `ContrastRow` is one (agent, contrast, pair, target): the metric under arm ``a`` minus
under arm ``b`` on the patients both arms paired, with the paired bootstrap interval, the
paired test, and how many patients were left out and why.
"""

from __future__ import annotations

from medomni_cas.store.encoding import Part, Record
from medomni_cas.store.ids import ObjectId

__all__ = ["COMPARISON_REFS", "Comparison", "ContrastRow", "comparison_ref"]

#: ``comparisons/<benchmark>/<set>``: the latest comparison of a set (`comparison_ref`).
COMPARISON_REFS = "comparisons/"


def comparison_ref(set_name: str) -> str:
    return COMPARISON_REFS + set_name


class ContrastRow(Part, frozen=True, kw_only=True):
    """One contrast, ``a`` - ``b``, for one agent, pair and target.

    ``difference`` is ``value_a - value_b`` over the ``patients`` paired (every
    repetition of each); ``ci_low``/``ci_high`` its paired bootstrap interval, and
    ``a_ci_*``/``b_ci_*`` each arm's value's interval on the same resamples. ``test`` is
    "mcnemar-exact" (per-patient correctness, one repetition a patient), "wilcoxon"
    (per-patient absolute errors of a numeric target, or per-patient correctness averaged
    over repetitions) or "" (no test); ``discordant`` counts the patients whose per-patient
    value differs, ``a_better`` and ``b_better`` split them. ``excluded`` patients (by
    reason, in ``excluded_why``) were not paired. ``families_a``/``families_b`` are the
    input families staged under each arm (the ladder's rungs)."""

    agent: str
    kind: str  # "arms" | "ladder"
    a: str  # arm label
    b: str  # arm label
    pair: str
    target: str
    metric: str
    higher_is_better: bool
    value_a: float | None
    value_b: float | None
    difference: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    a_ci_low: float | None = None
    a_ci_high: float | None = None
    b_ci_low: float | None = None
    b_ci_high: float | None = None
    patients: int
    reps_a: int
    reps_b: int
    excluded: int = 0
    excluded_why: dict[str, int] = {}
    test: str = ""
    statistic: float | None = None
    p_value: float | None = None
    p_holm: float | None = None
    discordant: int = 0
    a_better: int = 0
    b_better: int = 0
    config_a: str  # hex: the pair's build config under each arm
    config_b: str
    config_flag: str = ""  # set when the runs of an arm were built under another config hash
    families_a: tuple[str, ...] = ()
    families_b: tuple[str, ...] = ()


class Comparison(Record, frozen=True, kw_only=True):
    """Contrasts between arms of one task set, and everything they were computed from."""

    __kind__ = "medomni.comparison"

    task_set: ObjectId
    set_build: ObjectId
    jobs: tuple[ObjectId, ...]  # every job read, both arms of every contrast
    answer_keys: tuple[ObjectId, ...]
    answer_columns: tuple[ObjectId, ...]
    comparer: str
    comparer_version: str
    n_boot: int
    seed: int
    #: The contrasts asked for, ``a`` then ``b`` arm label each; empty: the defaults.
    asked: tuple[tuple[str, str], ...] = ()
    agents: tuple[str, ...] = ()  # the agents asked for; empty: every agent of the set
    rows: tuple[ContrastRow, ...]
    table: ObjectId  # blob: the rows as Parquet
