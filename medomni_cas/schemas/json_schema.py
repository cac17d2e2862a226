"""JSON Schema (draft 2020-12) of each file a user writes: msgspec's, with the docs added.

msgspec writes the types (required fields, defaults, ``additionalProperties: false`` where
unknown keys are refused). Added here: each struct's and field's description from its
docstring, the choices its checks accept, a number where the loader reads a plain scalar
as text, the task version's pattern, and the label recipes (the built-in ones, and any
object with another ``recipe`` for those a plug-in registers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from medomni_cas.schemas.fields import (
    BUILTIN_RECIPES,
    TEXT_KEYS,
    VERSION_PATTERN,
    choices,
    plain,
    recipe_tag,
    struct_doc,
    structs_of,
)
from medomni_cas.schemas.files import FILES, UserFile
from medomni_cas.studio.labels import Recipe
from medomni_cas.studio.specfile import Version

__all__ = ["DIALECT", "json_schema", "schema_text", "write_schemas"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_REF = "#/$defs/{name}"


def _hook(tp: type) -> dict[str, Any]:
    if tp is Version:
        return {"type": "string", "pattern": VERSION_PATTERN}
    if tp is Recipe:
        builtin = [recipe_tag(r) for r in BUILTIN_RECIPES]
        plugin = {
            "description": "A recipe a plug-in registers (entry point group `medomni.labels`); "
            "its other fields are the plug-in's.",
            "type": "object",
            "properties": {
                "recipe": {"type": "string", "not": {"enum": builtin}},
                "name": {"type": "string"},
            },
            "required": ["recipe", "name"],
        }
        refs = [{"$ref": _REF.format(name=r.__name__)} for r in BUILTIN_RECIPES]
        return {"anyOf": [*refs, plugin]}
    raise NotImplementedError(tp)


def _as_text(schema: dict[str, Any]) -> None:
    """A string field whose plain scalars the loader reads as text also takes a number."""
    if schema.get("type") != "string":
        return
    text = {k: schema.pop(k) for k in ("type", "pattern", "enum") if k in schema}
    schema["anyOf"] = [text, {"type": "number"}]


def _document(cls: type, component: dict[str, Any]) -> dict[str, Any]:
    doc = struct_doc(cls)
    component.pop("description", None)
    out = {k: component.pop(k) for k in ("title",) if k in component}
    if doc.text:
        out["description"] = plain(doc.text)
    out.update(component)
    for name, prop in out.get("properties", {}).items():
        if name in doc.fields:
            prop["description"] = plain(doc.fields[name])
        if (allowed := choices(cls, name)) is not None:
            target = prop["items"] if prop.get("type") == "array" else prop
            target["enum"] = list(allowed)
        if name in TEXT_KEYS:
            _as_text(prop)
    return out


def json_schema(f: UserFile) -> dict[str, Any]:
    """The JSON Schema of one kind of file."""
    structs = structs_of(f.struct)
    by_name = {cls.__name__: cls for cls in structs}
    if len(by_name) != len(structs):
        raise ValueError(f"{f.name}: two structs of the same name: {sorted(by_name)}")
    (root, *_), components = msgspec.json.schema_components(
        [f.struct, *BUILTIN_RECIPES], schema_hook=_hook, ref_template=_REF
    )
    defs = {name: _document(cls, components[name]) for name, cls in by_name.items()}
    return {
        "$schema": DIALECT,
        "title": f.title,
        "description": f"`{f.where}`",
        **root,
        "$defs": defs,
    }


def schema_text(f: UserFile) -> str:
    """`json_schema` as the text of its file: indented, keys in a fixed order."""
    return json.dumps(json_schema(f), indent=2, ensure_ascii=False) + "\n"


def write_schemas(out: str | Path) -> list[Path]:
    """Write ``<name>.schema.json`` for every file kind into ``out``; the paths written."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for f in FILES:
        path = folder / f"{f.name}.schema.json"
        path.write_text(schema_text(f), encoding="utf-8")
        written.append(path)
    return written
