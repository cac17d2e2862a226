"""Reference pages of the files a user writes, in Markdown, from their structs.

One page per kind of file: where it lives, then one table per struct it holds (field, type,
default, description), the top level first. `reference_index` lists the kinds and shows how
to point an editor at their JSON Schema files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import msgspec
from msgspec import inspect as mi

from medomni_cas.schemas.fields import (
    BUILTIN_RECIPES,
    choices,
    default_of,
    plain,
    recipe_tag,
    struct_doc,
    structs_of,
)
from medomni_cas.schemas.files import FILES, UserFile, user_file
from medomni_cas.studio.labels import Recipe
from medomni_cas.studio.specfile import Version

__all__ = ["modeline", "reference_index", "reference_page", "type_text"]

_RECIPES_ANCHOR = "label-recipes"
_SCALARS: dict[type, str] = {
    mi.StrType: "string",
    mi.IntType: "integer",
    mi.FloatType: "number",
    mi.BoolType: "boolean",
    mi.NoneType: "null",
    mi.AnyType: "any",
}


def modeline(f: UserFile, schema_folder: str = "schemas") -> str:
    """The first line that points yaml-language-server at ``f``'s schema, for a file at its
    place in a workspace whose schemas are in ``schema_folder`` at its root."""
    up = "../" * f.where.count("/")
    return f"# yaml-language-server: $schema={up}{schema_folder}/{f.name}.schema.json"


def _anchor(cls: type) -> str:
    return cls.__name__.lower()


def type_text(t: mi.Type) -> str:
    """A field's type in words, with links to the sections of the structs it holds."""
    if type(t) in _SCALARS:
        return _SCALARS[type(t)]
    if isinstance(t, mi.StructType):
        return f"[{t.cls.__name__}](#{_anchor(t.cls)})"
    if isinstance(t, mi.CustomType) and t.cls is Version:
        return 'version `"N.X"`'
    if isinstance(t, mi.CustomType) and t.cls is Recipe:
        return f"[label recipe](#{_RECIPES_ANCHOR})"
    if isinstance(t, mi.ListType | mi.VarTupleType):
        return f"list of {type_text(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"mapping of {type_text(t.key_type)} to {type_text(t.value_type)}"
    if isinstance(t, mi.UnionType):
        parts = sorted(t.types, key=lambda u: isinstance(u, mi.NoneType))  # null last
        return " or ".join(type_text(u) for u in parts)
    raise TypeError(f"no words for the field type {t!r}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(f: mi.Field) -> str:
    if f.required:
        return "required"
    if isinstance(f.default, msgspec.Struct):
        return "its defaults"
    return f"`{json.dumps(default_of(f), ensure_ascii=False)}`"


def _table(info: mi.StructType) -> list[str]:
    doc = struct_doc(info.cls)
    rows = ["| Field | Type | Default | Description |", "|---|---|---|---|"]
    if info.tag_field is not None:
        text = plain(doc.fields.get(info.tag_field, ""))
        rows.append(f"| `{info.tag_field}` | `{json.dumps(info.tag)}` | required | {_cell(text)} |")
    for f in info.fields:
        text = plain(doc.fields.get(f.encode_name, ""))
        if (allowed := choices(info.cls, f.encode_name)) is not None:
            text += " One of " + ", ".join(f"`{c}`" for c in allowed) + "."
        rows.append(
            f"| `{f.encode_name}` | {_cell(type_text(f.type))} | {_default(f)} | {_cell(text)} |"
        )
    return rows


def reference_page(f: UserFile, *, schema_url: str, example: tuple[str, str] | None = None) -> str:
    """The page of one kind of file; ``example`` is (where it is from, its text)."""
    structs = structs_of(f.struct)
    root = struct_doc(f.struct)
    out = [
        f"# {f.title}",
        "",
        f"`{f.where}` · JSON Schema: [{f.name}.schema.json]({schema_url})",
        "",
        plain(root.text),
        "",
        "To have an editor check the file and complete its keys, start it with "
        "([more](index.md#in-your-editor)):",
        "",
        "```yaml",
        modeline(f),
        "```",
        "",
        f"This page is generated from `{f.struct.__module__}.{f.struct.__qualname__}` "
        "and the structs it holds: their docstrings are the descriptions below.",
    ]
    if example is not None:
        source, text = example
        out += ["", "## Example", "", f"`{source}`:", "", "```yaml", text.rstrip("\n"), "```"]
    intro_due = True
    for cls, (info, paths) in structs.items():
        if cls in BUILTIN_RECIPES and intro_due:
            out += _recipes_intro(paths)
            intro_due = False
        out += ["", *_section(f, info, paths)]
    return "\n".join(out) + "\n"


def _recipes_intro(paths: Sequence[str]) -> list[str]:
    tags = ", ".join(f"`{recipe_tag(r)}`" for r in BUILTIN_RECIPES)
    where = ", ".join(f"`{p}`" for p in paths)
    return [
        "",
        f"## Label recipes {{#{_RECIPES_ANCHOR}}}",
        "",
        f"At {where}. A label's `recipe` picks its kind: {tags} are built in, and a plug-in "
        "registers more in the entry point group `medomni.labels` (a recipe computed by a "
        "function takes `name`, `table`, `classes`, `params` and `guards`, and must declare "
        "its guards).",
    ]


def _section(f: UserFile, info: mi.StructType, paths: Sequence[str]) -> list[str]:
    cls = info.cls
    doc = struct_doc(cls)
    if cls is f.struct:
        return ["## Top level {#" + _anchor(cls) + "}", "", *_table(info)]
    where = ", ".join(f"`{p}`" for p in paths)
    head = f"### {cls.__name__}" if issubclass(cls, Recipe) else f"## {cls.__name__}"
    lines = [head + " {#" + _anchor(cls) + "}", "", f"At {where}."]
    if doc.text:
        lines += ["", plain(doc.text)]
    return [*lines, "", *_table(info)]


def reference_index(*, schema_folder: str, schema_urls: dict[str, str]) -> str:
    """The reference's first page: every kind of file, and editor set-up for the schemas in
    ``schema_folder`` (as a workspace sees them); ``schema_urls`` links each kind's file."""
    out = [
        "# Reference",
        "",
        "Every field of every file a user writes. The pages and the JSON Schema files are "
        "generated from the msgspec structs the loaders read these files with (`python -m "
        "medomni_cas.schemas`), so they say what the code accepts; checks that types cannot "
        "express (a name matching its folder, a label existing in the dataset) are in the "
        "descriptions.",
        "",
        "| File | Where | JSON Schema |",
        "|---|---|---|",
    ]
    for f in FILES:
        url = schema_urls[f.name]
        out.append(f"| [{f.title}]({f.name}.md) | `{f.where}` | [{f.name}.schema.json]({url}) |")
    settings = {
        "yaml.schemas": {f"{schema_folder}/{f.name}.schema.json": list(f.globs) for f in FILES}
    }
    out += [
        "",
        "## In your editor",
        "",
        "The schema files are in the repository's `schemas/` folder; from an installed package, "
        "`python -m medomni_cas.schemas --out schemas` writes them. Editors that use "
        "yaml-language-server (VS Code with Red Hat's YAML extension, Neovim, Helix, "
        "JetBrains IDEs) then check each file as you type and complete its keys.",
        "",
        "One file: a comment on its first line, with the schema's path relative to the file "
        "(or a URL). With the schema files in `schemas/` at the workspace's root, a cohort "
        "file starts with:",
        "",
        "```yaml",
        modeline(user_file("cohort")),
        'version: "1.0"',
        "```",
        "",
        "Every file of a workspace at once, in `.vscode/settings.json`:",
        "",
        "```json",
        json.dumps(settings, indent=2),
        "```",
        "",
        "Name the schema in a comment, not in a `$schema:` key: the loaders refuse keys they "
        "do not know.",
    ]
    return "\n".join(out) + "\n"
