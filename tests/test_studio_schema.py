"""Studio file schemas: the example tree loads, and every kind of mistake names file:line: field."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from medomni_cas.errors import MedomniError
from medomni_cas.studio import folders, specfile
from medomni_cas.studio import schema as s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DS = Path("studio/datasets/synth-ehr")
CKD = DS / "tasks/synth-ehr_ckd-staging"
HBA = DS / "tasks/synth-ehr_hba1c-next"
BENCH = Path("bench/benchmarks/medomni-bench")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the example studio and bench, without generated data, to break at will."""
    for part in ("studio", "bench"):
        shutil.copytree(EXAMPLES / part, tmp_path / part, ignore=shutil.ignore_patterns("data"))
    return tmp_path


# -- the example tree ------------------------------------------------------------------------
def test_example_studio_loads() -> None:
    studio = folders.load_studio(EXAMPLES / "studio")
    ds = studio.datasets["synth-ehr"]
    assert ds.families == ("demographics", "encounters", "vitals", "labs", "medications", "ecg")
    assert [a.name for a in ds.arrays] == ["ecg"]
    assert ds.routes.local.policy == "allow" and ds.routes.cloud.policy == "conditional"
    assert ds.routes.cloud.conditions
    ckd, hba = ds.label("ckd_stage"), ds.label("hba1c_next")
    assert ckd is not None and ckd.kind == "classification"
    assert ckd.classes == ("G5", "G4", "G3b", "G3a", "G2", "G1")
    assert hba is not None and hba.kind == "numeric"

    assert sorted(studio.templates) == ["synth-ehr_ckd-staging", "synth-ehr_hba1c-next"]
    for tf in studio.templates.values():
        assert sorted(tf.cohorts) == ["n20", "n50"]
        moved = tf.name == "synth-ehr_ckd-staging"  # its n50 went nested at 2.0; 1.0 is kept
        assert {k: str(c.version) for k, c in tf.cohorts.items()} == {
            "n20": "1.0",
            "n50": "2.0" if moved else "1.0",
        }
        assert {k: sorted(v) for k, v in tf.kept.items()} == ({"n50": [1]} if moved else {})
        assert tf.template.evidence == ("default",)
        assert tf.ladder is not None and tf.ladder.cohort == "n20"
        assert tf.ladder.families("r1") == ("demographics",)
        assert set(tf.ladder.families("r6")) == set(tf.template.input.families)
    n20 = studio.templates["synth-ehr_ckd-staging"].cohorts["n20"]
    assert n20.per_class is not None and sum(n20.per_class.counts.values()) == n20.n == 20


def test_example_benchmark_loads() -> None:
    bench = folders.load_benchmark(EXAMPLES / BENCH)
    assert bench.card.name == "medomni-bench" and bench.card.intelligence_kinds == ("agent",)
    v1 = bench.sets["v1"]
    assert v1.builder == "medomni-v1"
    assert v1.arms == s.ARMS
    assert {p.task for p in v1.pairs} == {
        f"synth-ehr_{t}@{c}" for t in ("ckd-staging", "hba1c-next") for c in ("n20", "n50")
    }
    assert all(p.n == 1 for p in v1.pairs)
    ckd50 = "synth-ehr_ckd-staging@n50"
    assert list(bench.frozen["v1"]) == [ckd50] and bench.frozen["v1"][ckd50].kept is not None
    v2 = bench.sets["v2"]
    assert (v2.builder, v2.arms) == (v1.builder, v1.arms) and bench.frozen["v2"] == {}
    assert {p.task: p.n for p in v2.pairs} == {p.task: p.n for p in v1.pairs} | {ckd50: 2}


def test_single_file_loaders() -> None:
    cohort = folders.load_cohort(EXAMPLES / CKD / "cohorts/n50.yaml")
    assert cohort.n == 50 and cohort.prediction_time.offset_days == 1
    ladder = folders.load_ladder(EXAMPLES / HBA / "arms/modality-ladder.yaml")
    assert [r.name for r in ladder.rungs] == list(s.RUNGS)
    ts = folders.load_set(EXAMPLES / BENCH / "sets/v1.yaml", studio=EXAMPLES / "studio")
    assert len(ts.pairs) == 4


# -- Version ---------------------------------------------------------------------------------
def test_version_parse_and_order() -> None:
    v = s.Version.parse("1.10")
    assert (v.n, v.x) == (1, 10) and str(v) == "1.10"
    assert s.Version.parse("1.2") < s.Version.parse("1.10") < s.Version.parse("2.0")
    assert sorted(map(s.Version.parse, ["2.0", "1.10", "0.3", "1.2"])) == [
        s.Version(0, 3),
        s.Version(1, 2),
        s.Version(1, 10),
        s.Version(2, 0),
    ]
    assert s.Version.parse("3.1") == s.Version(3, 1)
    assert len({s.Version(1, 0), s.Version.parse("1.0")}) == 1
    with pytest.raises(AttributeError):
        v.n = 2  # type: ignore[misc]


@pytest.mark.parametrize("text", ["1", "1.x", "01.0", "1.01", "-1.0", "1.0.0", " 1.0", "v1.0", ""])
def test_version_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"N\.X"):
        s.Version.parse(text)


def test_version_written_as_a_yaml_number_keeps_its_digits(tree: Path) -> None:
    path = tree / CKD / "cohorts/n20.yaml"
    path.write_text(path.read_text().replace('version: "1.0"', "version: 1.10"))
    assert folders.load_cohort(path).version == s.Version(1, 10)  # not the float 1.1


# -- bad files: every error is "<file>:<line>: <field>: <problem>" ---------------------------
# (file, old text, new text, loader, text on the line the error must name, field, fragment)
Loader = Callable[[Path], object]


def _studio(root: Path) -> object:
    return folders.load_studio(root / "studio")


def _bench(root: Path) -> object:
    return folders.load_benchmark(root / BENCH)


TPL = CKD / "template.yaml"
DSY = DS / "dataset.yaml"
N20 = CKD / "cohorts/n20.yaml"
LAD = CKD / "arms/modality-ladder.yaml"
V1 = BENCH / "sets/v1.yaml"
# fmt: off
CASES = [
    # template.yaml
    ("tpl-typo", TPL, "    question:", "    questoin:", _studio, "questoin",
     "targets[0].questoin", "unknown field 'questoin' (did you mean 'question'?)"),
    ("tpl-metric", TPL, "metric: macro_f1", "metric: f1", _studio, "metric: f1",
     "targets[0].metric", "unknown metric 'f1'"),
    ("tpl-metric-kind", TPL, "metric: macro_f1", "metric: mae", _studio, "metric: mae",
     "targets[0].metric", "mae scores numeric labels; 'ckd_stage' is classification"),
    ("tpl-label", TPL, "label: ckd_stage", "label: ckd", _studio, "label: ckd",
     "targets[0].label", "no label 'ckd' in dataset synth-ehr"),
    ("tpl-family", TPL, "labs, medications, ecg]", "labs, meds, ecg]", _studio, "meds",
     "input.families[4]", "no family 'meds'"),
    ("tpl-evidence", TPL, "evidence: [default]", "evidence: [default, no-notes]", _studio,
     "evidence:", "evidence[1]", "evidence variant 'no-notes' is not built by this release"),
    ("tpl-internet", TPL, "internet: false", "internet: true", _studio, "internet:",
     "agent.environment.internet", "no network"),
    ("tpl-missing", TPL, "  submission_path: /workspace/answer.json\n", "", _studio, "agent:",
     "agent.submission_path", "missing required field"),
    ("tpl-type", TPL, "cpus: 1", "cpus: one", _studio, "cpus:", "agent.environment.cpus",
     "expected `int`, got `str`"),
    ("tpl-name", TPL, "name: synth-ehr_ckd-staging", "name: ckd", _studio, "name: ckd", "name",
     "must match its folder's name 'synth-ehr_ckd-staging'"),
    # dataset.yaml
    ("ds-route", DSY, "policy: allow", "policy: maybe", _studio, "policy: maybe",
     "routes.local.policy", "must be one of allow, deny, conditional; got 'maybe'"),
    ("ds-route-deny", DSY, "policy: conditional", "policy: deny", _studio, "conditions: >",
     "routes.cloud.conditions", "only a conditional route has conditions, not 'deny'"),
    ("ds-route-no-conditions", DSY, "policy: allow", "policy: conditional", _studio,
     "  local:", "routes.local.conditions", "a conditional route states its conditions"),
    ("ds-route-field", DSY, "    policy: conditional\n    conditions: >",
     "    policy: conditional\n    description: >", _studio, "    description: >\n      Synth",
     "routes.cloud.description", "unknown field 'description'"),
    ("ds-route-unknown", DSY, "  cloud:\n", "  edge:\n", _studio, "edge:", "routes.edge",
     "unknown field 'edge'"),
    ("ds-recipe", DSY, "recipe: first_after", "recipe: next_value", _studio,
     "recipe: next_value", "labels[1].recipe", "unknown label recipe 'next_value'"),
    ("ds-recipe-field", DSY, "    column: value\n    where: {test: HbA1c}",
     "    colunm: value\n    where: {test: HbA1c}", _studio, "colunm", "labels[1].colunm",
     "did you mean 'column'?"),
    ("ds-bins-type", DSY, "edges: [15, 30,", "edges: [low, 30,", _studio, "edges:",
     "labels[0].bins.edges[0]", "expected `float`, got `str`"),
    ("ds-bins-classes", DSY, "classes: [G5, G4, G3b, G3a, G2, G1]", "classes: [G5, G4]",
     _studio, "classes:", "labels[0].bins.classes", "5 edges make 6 classes; got 2"),
    ("ds-bins-order", DSY, "edges: [15, 30, 45, 60, 90]", "edges: [15, 30, 60, 45, 90]",
     _studio, "edges:", "labels[0].bins.edges", "strictly increasing"),
    ("ds-label-table", DSY, "    table: labs\n    column: value\n    where: {test: HbA1c}",
     "    table: lab\n    column: value\n    where: {test: HbA1c}", _studio, "table: lab\n",
     "labels[1].table", "no table 'lab'"),
    ("ds-guard", DSY, "      - table: labs\n", "      - table: labs\n        family: labs\n",
     _studio, "      - table: labs", "labels[0].guards[0]", "exactly one of `table` or `family`"),
    ("ds-table-file", DSY, "file: data/vitals.parquet", "file: data/vitals.xlsx", _studio,
     "vitals.xlsx", "tables[2].file", "a table is a .parquet, .csv, .csv.gz file"),
    ("ds-dup-table", DSY, "name: labs\n    file: data/labs", "name: vitals\n    file: data/labs",
     _studio, "name: vitals\n    file: data/labs", "tables[3]", "duplicate table 'vitals'"),
    ("ds-credentialed", DSY, "credentialed: false", "credentialed: maybe", _studio,
     "credentialed:", "credentialed", "expected `bool`, got `str`"),
    # cohorts
    ("cohort-version", N20, 'version: "1.0"', 'version: "1"', _studio, "version:", "version",
     'a version is N.X with whole numbers, like "1.0"; got \'1\''),
    ("cohort-counts", N20, "G1: 4,", "G1: 5,", _studio, "counts:", "per_class.counts",
     "the counts add up to 21, not n = 20"),
    ("cohort-class", N20, "G1: 4,", "G0: 4,", _studio, "counts:", "per_class.counts",
     "no class 'G0' in ckd_stage"),
    ("cohort-pick", N20, "pick: last", "pick: latest", _studio, "pick:",
     "prediction_time.pick", "must be first or last"),
    ("cohort-dup-key", N20, "n: 20\n", "n: 20\nn: 21\n", _studio, "n: 21", "n",
     "duplicate key"),
    ("cohort-syntax", N20, "counts: {G1: 4,", "counts: {G1: 4,,", _studio, "counts:", "",
     "YAML syntax"),
    # ladder
    ("ladder-count", LAD, "  - name: r6\n    add: [labs]\n", "", _studio, "rungs:", "rungs",
     "exactly the six rungs r1..r6; got 5"),
    ("ladder-order", LAD, "name: r3", "name: r4", _studio, "name: r4", "rungs[2].name",
     "expected 'r3' here"),
    ("ladder-adds", LAD, "add: [medications]", "add: [medications, vitals]", _studio,
     "add: [medications, vitals]", "rungs[4].add[1]", "family 'vitals' is already staged at r3"),
    ("ladder-empty", LAD, "add: [labs]", "add: []", _studio, "add: []", "rungs[5].add",
     "each rung adds at least one family"),
    ("ladder-cohort", LAD, "cohort: n20", "cohort: n30", _studio, "cohort:", "cohort",
     "no cohort 'n30'"),
    # benchmark and sets
    ("set-n", V1, "synth-ehr_ckd-staging@n50, n: 1", "synth-ehr_ckd-staging@n50, n: 3",
     _bench, "@n50, n: 3", "pairs[1].n", "pinned at N=3, but synth-ehr_ckd-staging@n50 is at"),
    ("set-cohort", V1, "ckd-staging@n50", "ckd-staging@n99", _bench, "@n99",
     "pairs[1].task", "has no cohort 'n99'"),
    ("set-template", V1, "synth-ehr_hba1c-next@n20", "synth-ehr_glucose@n20", _bench,
     "glucose", "pairs[2].task", "no template 'synth-ehr_glucose'"),
    ("set-pair", V1, "synth-ehr_hba1c-next@n20", "synth-ehr_hba1c-next", _bench,
     "next, n", "pairs[2].task", "a pair is written <template>@<cohort>"),
    ("set-arm", V1, "encoders-required", "encoder-required", _bench, "arms:", "arms[2]",
     "unknown arm 'encoder-required'"),
    ("bench-field", BENCH / "benchmark.yaml", "license:", "licence:", _bench, "licence:",
     "licence", "did you mean 'license'?"),
]
# fmt: on


@pytest.mark.parametrize(
    ("file", "old", "new", "load", "at", "field", "fragment"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_file_names_file_line_field(
    tree: Path,
    file: Path,
    old: str,
    new: str,
    load: Loader,
    at: str,
    field: str,
    fragment: str,
) -> None:
    path = tree / file
    text = path.read_text()
    assert text.count(old) == 1, f"test case: {old!r} must occur once in {file}"
    text = text.replace(old, new)
    path.write_text(text)
    line = text[: text.index(at)].count("\n") + 1
    with pytest.raises(s.SpecError) as info:
        load(tree)
    err = info.value
    assert (Path(err.file), err.line, err.field) == (path, line, field), str(err)
    assert fragment in err.problem, str(err)
    prefix = f"{path}:{line}: {field}: " if field else f"{path}:{line}: "
    assert str(err).startswith(prefix)
    assert isinstance(err, MedomniError) and isinstance(err, ValueError)


def test_missing_ladder_when_the_set_has_the_arm(tree: Path) -> None:
    (tree / CKD / "arms/modality-ladder.yaml").unlink()
    with pytest.raises(s.SpecError) as info:
        folders.load_benchmark(tree / BENCH)
    assert info.value.field == "arms[3]" and "no arms/modality-ladder.yaml" in info.value.problem
    assert Path(info.value.file) == tree / V1


def test_missing_files_are_named(tree: Path) -> None:
    (tree / TPL).unlink()
    with pytest.raises(s.SpecError, match=r"template\.yaml: no such file") as info:
        folders.load_template(tree / CKD)
    assert info.value.line is None
    with pytest.raises(s.SpecError, match="no such file"):
        folders.load_cohort(tree / CKD / "cohorts/n99.yaml")


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("", 1, "the file is empty; expected a mapping"),
        ("- n: 20\n", 1, "expected a mapping, got a list"),
        ("just text\n", 1, "expected a mapping, got `str`"),
        ("version: '1.0'\nn: [1,\n", 3, "YAML syntax"),
        ("version: '1.0'\n\tn: 2\n", 2, "YAML syntax"),
        ("version: '1.0'\nn: &x [*x]\n", 2, "recursive YAML alias"),
    ],
)
def test_whole_file_errors(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(s.SpecError) as info:
        specfile.load_yaml(path, s.Cohort)
    assert info.value.line == line, str(info.value)
    assert problem in info.value.problem


def test_names_stay_text_but_filter_values_stay_numbers(tree: Path) -> None:
    path = tree / CKD / "cohorts/n20.yaml"
    path.write_text(path.read_text().replace("{test: eGFR}", "{test: 2.10}"))
    assert folders.load_cohort(path).inclusion.requires[0].where == {"test": 2.1}


def test_first_of_several_problems_is_reported_with_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "modality-ladder.yaml"
    path.write_text(
        "cohort: n20\nrungs:\n"
        + "".join(f"  - name: r{i}\n    add: [f{i}]\n" for i in range(1, 7)).replace(
            "add: [f5]", "add: [f2]"
        )
    )
    with pytest.raises(s.SpecError) as info:
        folders.load_ladder(path)
    assert (info.value.line, info.value.field) == (12, "rungs[4].add[0]")
    assert "already staged at r2" in str(info.value)
