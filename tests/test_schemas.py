"""The JSON Schema files and reference pages of the files a user writes: generated, committed,
and true to the loaders (every example file validates; what the loader refuses, they refuse)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml

from medomni_cas.schemas import FILES, WorkspaceFile, json_schema, schema_text, user_file
from medomni_cas.schemas.__main__ import main
from medomni_cas.schemas.fields import (
    BUILTIN_RECIPES,
    CHOICES,
    VERSION_PATTERN,
    field_names,
    struct_doc,
    structs_of,
)
from medomni_cas.schemas.files import UserFile
from medomni_cas.schemas.markdown import modeline, reference_index, reference_page
from medomni_cas.studio import labels
from medomni_cas.studio.schema import Cohort
from medomni_cas.studio.specfile import SpecError, Version, load_yaml
from medomni_cas.workspace import load_workspace

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "schemas"
EXAMPLES = ROOT / "examples"


def _validator(f: UserFile) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json_schema(f))


def _examples(f: UserFile) -> list[Path]:
    """The example files of one kind: under examples/, and the repository's own workspace."""
    found = {p for g in f.globs for p in EXAMPLES.glob(g)}
    found |= {p for g in f.globs for p in ROOT.glob(g.removeprefix("**/")) if p.parent == ROOT}
    return sorted(found)


def _read(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# -- generated and committed -----------------------------------------------------------------
def test_committed_schema_files_are_what_the_generator_writes() -> None:
    want = {f"{f.name}.schema.json": schema_text(f) for f in FILES}
    have = {p.name: p.read_text(encoding="utf-8") for p in COMMITTED.glob("*")}
    assert sorted(have) == sorted(want), "schemas/ holds other files than the generator's"
    for name, text in want.items():
        assert have[name] == text, (
            f"schemas/{name} is stale: run python -m medomni_cas.schemas --out schemas"
        )


def test_the_module_writes_the_schemas_and_pages(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path / "s"), "--pages", str(tmp_path / "p")]) == 0
    for f in FILES:
        written = (tmp_path / "s" / f"{f.name}.schema.json").read_text(encoding="utf-8")
        assert written == (COMMITTED / f"{f.name}.schema.json").read_text(encoding="utf-8")
        page = (tmp_path / "p" / f"{f.name}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {f.title}\n")
    assert (tmp_path / "p" / "index.md").is_file()


@pytest.mark.parametrize("f", FILES, ids=lambda f: f.name)
def test_each_schema_is_a_valid_draft_2020_12_schema(f: UserFile) -> None:
    jsonschema.Draft202012Validator.check_schema(json_schema(f))


def test_the_files_are_the_eight_a_user_writes() -> None:
    names = [f.name for f in FILES]
    assert names == sorted(set(names), key=names.index)
    want = {"dataset", "template", "cohort", "ladder", "benchmark", "set", "agent", "workspace"}
    assert set(names) == want
    with pytest.raises(KeyError, match="no file kind 'nope'"):
        user_file("nope")


# -- descriptions cannot drift ---------------------------------------------------------------
@pytest.mark.parametrize("f", FILES, ids=lambda f: f.name)
def test_every_field_has_a_description_and_every_description_a_field(f: UserFile) -> None:
    for cls, (info, _) in structs_of(f.struct).items():
        doc = struct_doc(cls)
        names = field_names(info)
        assert doc.text, f"{cls.__name__} has no description"
        missing = [n for n in names if n not in doc.fields]
        assert not missing, f"{cls.__name__}: no description of {missing} in its docstring"
        stale = sorted(set(doc.fields) - set(names))
        assert not stale, f"{cls.__name__}: its docstring describes no field {stale}"


@pytest.mark.parametrize("f", FILES, ids=lambda f: f.name)
def test_the_reference_page_has_a_row_per_field(f: UserFile) -> None:
    page = reference_page(f, schema_url=f"../schemas/{f.name}.schema.json")
    for cls, (info, _) in structs_of(f.struct).items():
        section = page.split("{#" + cls.__name__.lower() + "}", 1)[1]
        for name in field_names(info):
            assert f"\n| `{name}` |" in section, f"{cls.__name__}.{name} is not on the page"


def test_a_docstring_fields_section_is_read_with_continuations() -> None:
    class Example(msgspec.Struct):
        """What it is.

        Fields:
            a: First line
                and its continuation.
            b: Another.
        """

        a: int
        b: int

    doc = struct_doc(Example)
    assert doc.text == "What it is."
    assert doc.fields == {"a": "First line and its continuation.", "b": "Another."}


def test_a_recipe_inherits_its_fields_descriptions() -> None:
    for recipe in BUILTIN_RECIPES:
        assert set(struct_doc(recipe).fields) >= {"recipe", "name", "table", "column", "guards"}
    assert set(BUILTIN_RECIPES) == set(labels._BUILTIN.values())


def test_the_index_maps_every_schema_to_its_globs() -> None:
    urls = {f.name: f"../schemas/{f.name}.schema.json" for f in FILES}
    index = reference_index(schema_folder="./schemas", schema_urls=urls)
    settings = json.loads(index.split("```json\n", 1)[1].split("```", 1)[0])
    assert settings["yaml.schemas"] == {
        f"./schemas/{f.name}.schema.json": list(f.globs) for f in FILES
    }


# -- the examples, against their schemas -----------------------------------------------------
def test_every_example_yaml_file_has_exactly_one_schema() -> None:
    kinds: dict[Path, list[str]] = {}
    for f in FILES:
        for path in _examples(f):
            kinds.setdefault(path, []).append(f.name)
    every = set(EXAMPLES.rglob("*.yaml")) | {p for p in [ROOT / "workspace.yaml"] if p.is_file()}
    assert {p for p in every if p not in kinds} == set(), "YAML files no schema covers"
    assert {p: k for p, k in kinds.items() if len(k) != 1} == {}
    assert {k[0] for k in kinds.values()} >= {f.name for f in FILES} - {"workspace"}


@pytest.mark.parametrize("f", FILES, ids=lambda f: f.name)
def test_every_example_file_validates_against_its_schema(f: UserFile) -> None:
    validator = _validator(f)
    for path in _examples(f):
        errors = [
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(_read(path))
        ]
        assert errors == [], f"{path.relative_to(ROOT)}: {errors}"


@pytest.mark.parametrize("f", FILES, ids=lambda f: f.name)
def test_an_unknown_key_is_refused_by_the_schema_and_the_loader(
    f: UserFile, tmp_path: Path
) -> None:
    examples = _examples(f)
    data = _read(examples[0]) if examples else {}
    data["colour"] = "red"
    path = tmp_path / "file.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert not _validator(f).is_valid(data)
    with pytest.raises((SpecError, msgspec.ValidationError)):
        load_yaml(path, f.struct)


def test_a_missing_required_field_is_refused_by_both(tmp_path: Path) -> None:
    f = user_file("template")
    data = _read(_examples(f)[0])
    del data["agent"]["submission_path"]
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert "'submission_path' is a required property" in [
        e.message for e in _validator(f).iter_errors(data)
    ]
    with pytest.raises(SpecError, match=r"agent\.submission_path: missing required field"):
        load_yaml(path, f.struct)


# -- choices, text keys, versions, recipes: the schema says what the loader does ------------
def _at(data: Any, path: str) -> Any:
    """The mapping at ``tables[].x`` in a file's data, the first item of each list."""
    for part in filter(None, path.split(".")):
        name = part.removesuffix("[]")
        data = data[name]
        if part.endswith("[]"):
            data = data[0]
    return data


def _load_error(path: Path, tp: type, data: Any) -> SpecError | None:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    try:
        load_yaml(path, tp)
    except SpecError as e:
        return e
    return None


@pytest.mark.parametrize("key", list(CHOICES), ids=lambda k: f"{k[0].__name__}.{k[1]}")
def test_choices_are_what_the_checks_accept(key: tuple[type, str], tmp_path: Path) -> None:
    cls, field = key
    f, where = next(
        (f, structs_of(f.struct)[cls][1][0])
        for f in FILES
        if cls in structs_of(f.struct) and _examples(f)
    )
    original = _read(_examples(f)[0])
    is_list = isinstance(_at(original, where).get(field), list)
    at = f"{where}.{field}".lstrip(".").replace("[]", "[0]")
    for value in (*CHOICES[key], "not-a-choice"):
        data = copy.deepcopy(original)
        _at(data, where)[field] = [value] if is_list else value
        error = _load_error(tmp_path / "file.yaml", f.struct, data)
        wrong = error is not None and error.field.startswith(at)
        assert wrong == (value == "not-a-choice"), (value, error)
        assert _validator(f).is_valid(data) == (value != "not-a-choice")


def test_an_unquoted_version_is_read_as_text_by_both(tmp_path: Path) -> None:
    f = user_file("cohort")
    text = _examples(f)[0].read_text(encoding="utf-8").replace('version: "1.0"', "version: 1.10")
    assert "version: 1.10" in text
    path = tmp_path / "n20.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_yaml(path, Cohort).version == Version(1, 10)
    assert _validator(f).is_valid(yaml.safe_load(text))


@pytest.mark.parametrize(
    "text", ["1.0", "0.0", "10.23", "01.0", "1.01", "1", "1.0.0", "a.b", " 1.0", "1.0 "]
)
def test_the_version_pattern_is_the_loaders(text: str) -> None:
    try:
        Version.parse(text)
        parsed = True
    except ValueError:
        parsed = False
    assert (re.search(VERSION_PATTERN, text) is not None) == parsed
    validator = _validator(user_file("cohort"))
    version = validator.schema["$defs"]["Cohort"]["properties"]["version"]
    assert jsonschema.Draft202012Validator(version).is_valid(text) == parsed


def test_a_plugin_recipe_validates_and_a_broken_builtin_does_not() -> None:
    f = user_file("dataset")
    data = _read(_examples(f)[0])
    plugin = {"recipe": "my_plugin", "name": "x", "table": "labs", "guards": [{"table": "labs"}]}
    ok = copy.deepcopy(data)
    ok["labels"].append(plugin)
    assert _validator(f).is_valid(ok)
    broken = copy.deepcopy(data)
    del broken["labels"][0]["column"]  # a last_before without its column
    assert not _validator(f).is_valid(broken)


# -- workspace.yaml: the schema's keys are the loader's --------------------------------------
def test_the_workspace_schema_has_the_loaders_keys(tmp_path: Path) -> None:
    f = user_file("workspace")
    every = msgspec.to_builtins(WorkspaceFile(remotes={"origin": "memory://"}))
    assert set(every) == set(WorkspaceFile.__struct_fields__)
    (tmp_path / "workspace.yaml").write_text(yaml.safe_dump(every), encoding="utf-8")
    ws = load_workspace(tmp_path)
    assert ws.bench == (tmp_path / "bench").resolve()
    assert _validator(f).is_valid(every)
    (tmp_path / "workspace.yaml").write_text(yaml.safe_dump({**every, "colour": "red"}))
    with pytest.raises(ValueError, match="colour"):
        load_workspace(tmp_path)
    assert not _validator(f).is_valid({**every, "colour": "red"})


def test_the_modeline_climbs_from_the_files_place_to_the_workspace_root(tmp_path: Path) -> None:
    for f in FILES:
        line = modeline(f)
        target = line.split("$schema=", 1)[1]
        here = tmp_path / f.where.replace("<", "").replace(">", "")
        assert (here.parent / target).resolve() == tmp_path / "schemas" / f"{f.name}.schema.json"
