"""What the schemas say of each field: its description, its choices, and the structs it holds.

Descriptions
    A file-schema struct documents its fields in a ``Fields:`` section at the end of its
    docstring, one ``name: text`` entry per field (continuation lines indented deeper).
    A subclass inherits the entries of its bases (the built-in label recipes share theirs).
    The text before the section describes the struct.

Choices
    Some string fields take one of a few values, which the struct's ``problems()`` checks
    rather than its type (changing the type would change the loader's error messages).
    `CHOICES` names them from the same constants the checks use; a test loads every choice
    and one value outside them through the real loader.

Plain scalars read as text
    The loader reads ``version``, ``release``, ``name`` and ``license`` as the text written
    (``version: 1.10`` is ``"1.10"``, not 1.1), so the schemas accept a number there too.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import inspect as mi

from medomni_cas.bench.agents import KINDS, ROUTES, AgentFile
from medomni_cas.studio.labels import PERIODS, FirstAfter, Guard, LastBefore, Recipe
from medomni_cas.studio.schema import (
    EVIDENCE_BUILT,
    METRICS,
    ROUTE_POLICIES,
    SELECTIONS,
    Cohort,
    PredictionTime,
    Route,
    Target,
    Template,
)
from medomni_cas.studio.specfile import _STRING_KEYS, Version

__all__ = [
    "BUILTIN_RECIPES",
    "CHOICES",
    "TEXT_KEYS",
    "VERSION_PATTERN",
    "choices",
    "default_of",
    "field_names",
    "plain",
    "recipe_tag",
    "StructDoc",
    "struct_doc",
    "structs_of",
]

#: The label recipes every installation has; plug-ins add more by entry point.
BUILTIN_RECIPES: tuple[type[Recipe], ...] = (LastBefore, FirstAfter)

#: (struct, field) -> the values ``problems()`` accepts (for a list field: its items').
CHOICES: dict[tuple[type[msgspec.Struct], str], tuple[str, ...]] = {
    (Route, "policy"): ROUTE_POLICIES,
    (Target, "metric"): tuple(METRICS),
    (Template, "evidence"): (EVIDENCE_BUILT,),
    (PredictionTime, "pick"): ("first", "last"),
    (Cohort, "selection"): SELECTIONS,
    (Guard, "period"): PERIODS,
    (AgentFile, "kind"): KINDS,
    (AgentFile, "route"): ROUTES,
}

#: Keys whose plain scalars the loader reads as the text written.
TEXT_KEYS: frozenset[str] = _STRING_KEYS

#: `Version` as a JSON Schema pattern: N.X with whole numbers and no leading zeros.
VERSION_PATTERN = "^" + Version._RE.pattern.removesuffix(r"\Z") + "$"

_ENTRY = re.compile(r"(\w+): (.*)")
_RST_CODE = re.compile(r"``([^`]+)``")
_WRAP = re.compile(r"(?<!\n)\n(?!\n)")


def plain(text: str) -> str:
    """Docstring text as Markdown, one line per paragraph: ````x```` becomes ```x```."""
    return _WRAP.sub(" ", _RST_CODE.sub(r"`\1`", text))


@dataclass(frozen=True)
class StructDoc:
    """A struct's description and its fields' descriptions, from its docstrings."""

    text: str
    fields: dict[str, str]


def _parse(doc: str | None) -> StructDoc:
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = lines.index("Fields:")
    except ValueError:
        return StructDoc("\n".join(lines).strip(), {})
    fields: dict[str, str] = {}
    name = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        m = _ENTRY.fullmatch(line.strip())
        if depth <= 4 and m is not None:
            name = m[1]
            fields[name] = m[2]
        elif name is not None and depth > 4:
            fields[name] += " " + line.strip()
        else:
            raise ValueError(f"cannot read this line of a Fields: section: {line!r}")
    return StructDoc("\n".join(lines[:start]).strip(), fields)


def struct_doc(cls: type) -> StructDoc:
    """``cls``'s own description, and every field's text from it or the nearest base."""
    own = _parse(cls.__dict__.get("__doc__"))
    fields: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if base not in (object, msgspec.Struct):
            fields.update(_parse(base.__dict__.get("__doc__")).fields)
    fields.update(own.fields)
    return StructDoc(own.text, fields)


def field_names(info: mi.StructType) -> tuple[str, ...]:
    """The keys a file can hold for this struct: its tag field, then its fields."""
    tag = (info.tag_field,) if info.tag_field is not None else ()
    return (*tag, *(f.encode_name for f in info.fields))


def _inner(t: mi.Type) -> Iterator[mi.Type]:
    if isinstance(t, mi.UnionType):
        for u in t.types:
            yield from _inner(u)
    elif isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        yield from _inner(t.item_type)
    elif isinstance(t, mi.TupleType):
        for u in t.item_types:
            yield from _inner(u)
    elif isinstance(t, mi.DictType):
        yield from _inner(t.value_type)
    elif isinstance(t, mi.CustomType) and t.cls is Recipe:
        for r in BUILTIN_RECIPES:
            yield mi.type_info(r)
    else:
        yield t


def structs_of(root: type[msgspec.Struct]) -> dict[type, tuple[mi.StructType, list[str]]]:
    """Every struct a file holds, from ``root`` down, with the paths it is found at
    (``tables[]``, ``routes.local``; ``""`` for the root). The structs one field can hold
    (the label recipes) come together, before what they hold."""
    info = mi.type_info(root)
    assert isinstance(info, mi.StructType)
    found: dict[type, tuple[mi.StructType, list[str]]] = {root: (info, [""])}

    def visit(info: mi.StructType, path: str) -> None:
        for f in info.fields:
            suffix = "[]" if _is_list_or_map(f.type) else ""
            at = f"{path}.{f.encode_name}{suffix}".lstrip(".")
            new = []
            for t in _inner(f.type):
                if not isinstance(t, mi.StructType):
                    continue
                if t.cls not in found:
                    found[t.cls] = (t, [at])
                    new.append(t)
                elif at not in found[t.cls][1]:
                    found[t.cls][1].append(at)
            for t in new:
                visit(t, at)

    visit(info, "")
    return found


def _is_list_or_map(t: mi.Type) -> bool:
    if isinstance(t, mi.UnionType):
        return any(_is_list_or_map(u) for u in t.types)
    if isinstance(t, mi.CustomType):
        return False
    return isinstance(t, mi.ListType | mi.VarTupleType | mi.TupleType | mi.DictType)


def recipe_tag(cls: type) -> str:
    """The ``recipe`` a file writes for a recipe struct."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType) and isinstance(info.tag, str)
    return info.tag


def choices(cls: type, field: str) -> tuple[str, ...] | None:
    """The values ``field`` of ``cls`` takes, where a check limits them."""
    return CHOICES.get((cls, field))


def default_of(f: mi.Field) -> Any:
    """A field's default as a file would write it (a list for a tuple, a mapping for a
    struct); `msgspec.NODEFAULT` for a required field."""
    if f.default_factory is not msgspec.NODEFAULT:
        value = f.default_factory()
    elif f.default is not msgspec.NODEFAULT:
        value = f.default
    else:
        return msgspec.NODEFAULT
    return msgspec.to_builtins(value)
