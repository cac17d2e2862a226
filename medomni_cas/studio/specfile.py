"""Reading the YAML files a user writes, with every error pinned to file, line and field.

A file is parsed with PyYAML's node API (so each value keeps its line), converted with
msgspec into a `Spec` struct, then checked: types by msgspec, values by each struct's
``problems()``. An error is a `SpecError`:
``tasks/t/template.yaml:7: targets[0].metric: unknown metric 'f1' (known: accuracy, ...)``.
"""

from __future__ import annotations

import difflib
import functools
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from medomni_cas.errors import MedomniError
from medomni_cas.studio.labels import Recipe, recipe_type

__all__ = [
    "Doc",
    "Problems",
    "Spec",
    "SpecError",
    "Version",
    "bad_name",
    "check_named",
    "convert",
    "load_with_doc",
    "load_yaml",
    "not_relative",
    "unique",
]

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
Problems = Iterator[tuple[str, str]]


class SpecError(MedomniError, ValueError):
    """A file a user wrote is wrong: where (file, line, field) and what."""

    def __init__(self, file: str | Path, line: int | None, field: str, problem: str) -> None:
        self.file = str(file)
        self.line = line
        self.field = field
        self.problem = problem
        where = self.file if line is None else f"{self.file}:{line}"
        super().__init__(": ".join(p for p in (where, field, problem) if p))


@functools.total_ordering
class Version:
    """A task version N.X: N rises when results stop being comparable, X for anything else.

    Written ``"1.0"`` in a cohort file. A plain class rather than a Struct so that msgspec
    hands the string to the loader's hook, which parses it at the field's own path.
    """

    __slots__ = ("n", "x")
    n: int
    x: int

    def __init__(self, n: int, x: int) -> None:
        if n < 0 or x < 0:
            raise ValueError("version numbers are not negative")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "x", x)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Version is immutable")

    _RE: typing.ClassVar[re.Pattern[str]] = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\Z")

    @classmethod
    def parse(cls, text: str) -> Version:
        m = cls._RE.match(text)
        if m is None:
            raise ValueError(f'a version is N.X with whole numbers, like "1.0"; got {text!r}')
        return cls(int(m[1]), int(m[2]))

    def __str__(self) -> str:
        return f"{self.n}.{self.x}"

    def __repr__(self) -> str:
        return f"Version({self.n}, {self.x})"

    def __eq__(self, other: object) -> bool:
        return (
            (self.n, self.x) == (other.n, other.x) if isinstance(other, Version) else NotImplemented
        )

    def __lt__(self, other: Version) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return (self.n, self.x) < (other.n, other.x)

    def __hash__(self) -> int:
        return hash((self.n, self.x))


class Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every file schema.

    frozen: a loaded file is a value, compared and hashed, never edited in place;
    kw_only: every field is named, so fields can be added in any order later;
    forbid_unknown_fields: a misspelt key is an error naming it, not a silently ignored line.
    Subclasses pass ``kw_only=True`` too (msgspec applies it per class). A struct may define
    ``problems()``, yielding ``(field, what is wrong)`` for values its types cannot refuse.
    """


def unique(names: typing.Sequence[str], field: str, what: str) -> Problems:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield f"{field}[{i}]", f"duplicate {what} {name!r}"
        seen.add(name)


def bad_name(name: str) -> str | None:
    if _NAME.match(name):
        return None
    return f"{name!r} is not a valid name (lowercase letters, digits, '.', '_', '-')"


def not_relative(path: str) -> str | None:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        return f"{path!r} must be a path inside the folder (relative, no '..')"
    return None


# -- YAML with lines -------------------------------------------------------------------------
# Keys whose values are names, never numbers: `version: 1.10` must not become 1.1.
_STRING_KEYS = frozenset({"version", "release", "name", "license"})
_DATA_KEYS = frozenset({"where", "params", "counts"})
_STR_TAG = "tag:yaml.org,2002:str"
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_AT = re.compile(r" - at `(\$[^`]*)`")


@dataclass(frozen=True)
class Doc:
    """A parsed file: where errors about it point."""

    path: Path
    root: yaml.Node | None

    def line(self, parts: typing.Sequence[str | int]) -> int | None:
        """The line of the deepest node on the path (the key's line for a mapping entry)."""
        node = self.root
        if node is None:
            return 1
        line = node.start_mark.line + 1
        for part in parts:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                hit = next((kv for kv in node.value if kv[0].value == part), None)
                if hit is None:
                    break
                line, node = hit[0].start_mark.line + 1, hit[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    break
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def error(self, field: str, problem: str) -> SpecError:
        return SpecError(self.path, self.line(_parts(field)), field, problem)


def _parts(field: str) -> list[str | int]:
    """``targets[0].metric`` (or ``$.targets[0].metric``) -> ["targets", 0, "metric"]."""
    text = field.removeprefix("$")
    if text and not text.startswith((".", "[")):
        text = "." + text
    out: list[str | int] = []
    for m in _PATH_PART.finditer(text):
        if m[1] is not None:
            out.append(m[1])
        elif m[2] != "...":
            out.append(int(m[2]))
        else:
            out.append("...")
    return out


def _render(parts: typing.Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) or p == "..." else (f".{p}" if out else p)
    return out


def _prepare(
    node: yaml.Node,
    doc: Doc,
    path: list[str | int],
    *,
    data: bool = False,
    above: tuple[int, ...] = (),
) -> None:
    """Refuse duplicate keys (PyYAML keeps the last silently) and recursive aliases, and keep
    names as text (not inside ``data`` mappings such as ``where``: those values are the user's)."""
    if id(node) in above:
        raise SpecError(doc.path, node.start_mark.line + 1, _render(path), "recursive YAML alias")
    above = (*above, id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else None
            if k is not None and k in seen:
                field = _render([*path, k])
                raise SpecError(doc.path, key.start_mark.line + 1, field, "duplicate key")
            if k is not None:
                seen.add(k)
            if (
                not data
                and k in _STRING_KEYS
                and isinstance(value, yaml.ScalarNode)
                and value.style is None
                and value.tag != "tag:yaml.org,2002:null"
            ):
                value.tag = _STR_TAG
            inner = data or k in _DATA_KEYS
            _prepare(value, doc, [*path, k if k is not None else "?"], data=inner, above=above)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _prepare(item, doc, [*path, i], data=data, above=above)


def _parse(path: Path) -> tuple[Any, Doc]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(path, None, "", "no such file") from None
    except IsADirectoryError:
        raise SpecError(path, None, "", "is a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, None, "", f"not UTF-8 text: {e}") from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        doc = Doc(path, root)
        if root is not None:
            _prepare(root, doc, [])
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(p for p in (e.context, e.problem) if p)
        if e.context_mark is not None and mark is not None and e.context_mark.line != mark.line:
            problem += f" (opened on line {e.context_mark.line + 1})"
        raise SpecError(path, line, "", f"YAML syntax: {problem}") from None
    except yaml.YAMLError as e:
        raise SpecError(path, None, "", f"YAML syntax: {e}") from None
    finally:
        loader.dispose()
    return data, doc


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Version:
        if isinstance(obj, str):
            return Version.parse(obj)
        raise ValueError(f'a version is written N.X, like "1.0"; got {obj!r}')
    if tp is Recipe:
        return _recipe(obj)
    raise NotImplementedError


def _recipe(obj: Any) -> Recipe:
    if not isinstance(obj, dict):
        raise ValueError(f"Expected `object`, got `{type(obj).__name__}`")
    name = obj.get("recipe")
    if name is None:
        raise ValueError("Object missing required field `recipe`")
    try:
        cls = recipe_type(str(name))
    except KeyError as e:
        raise ValueError(f"{e.args[0]} - at `$.recipe`") from None
    try:
        return msgspec.convert(obj, cls, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        # The hook's own path is lost by msgspec: keep it in the text, `_located` joins them.
        raise ValueError(str(e)) from None


def _type_at(tp: Any, data: Any, parts: typing.Sequence[str | int]) -> Any:
    """The schema type at a path, following the data through unions and recipes."""
    for part in parts:
        tp = _concrete(tp, data)
        if isinstance(part, str) and isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            tp = typing.get_type_hints(tp).get(part)
            data = data.get(part) if isinstance(data, dict) else None
        elif isinstance(part, int) and typing.get_origin(tp) is tuple:
            tp = typing.get_args(tp)[0]
            data = data[part] if isinstance(data, list) and part < len(data) else None
        else:
            return None
    return _concrete(tp, data)


def _concrete(tp: Any, data: Any) -> Any:
    if tp is Recipe:
        try:
            return recipe_type(str(data.get("recipe"))) if isinstance(data, dict) else None
        except KeyError:
            return None
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _located(e: msgspec.ValidationError, doc: Doc, tp: Any, data: Any) -> SpecError:
    text = str(e)
    paths = _AT.findall(text)
    problem = _AT.sub("", text)
    parts: list[str | int] = []
    for p in reversed(paths):  # outermost last in the text; inner paths are relative
        parts.extend(_parts(p))
    if m := re.fullmatch(r"Object missing required field `([^`]+)`", problem):
        line = doc.line(parts)
        return SpecError(doc.path, line, _render([*parts, m[1]]), "missing required field")
    if m := re.fullmatch(r"Object contains unknown field `([^`]+)`", problem):
        cls = _type_at(tp, data, parts)
        fields = list(getattr(cls, "__struct_fields__", ()))
        hint = difflib.get_close_matches(m[1], fields, n=1)
        why = f"unknown field {m[1]!r}"
        if hint:
            why += f" (did you mean {hint[0]!r}?)"
        elif fields:
            why += f" (allowed: {', '.join(fields)})"
        parts.append(m[1])
        return SpecError(doc.path, doc.line(parts), _render(parts), why)
    problem = (
        problem.replace("`object`", "a mapping")
        .replace("`array`", "a list")
        .replace("`null`", "nothing")
    )
    if not parts and data is None:
        problem = "the file is empty; expected a mapping"
    problem = problem[:1].lower() + problem[1:]
    return SpecError(doc.path, doc.line(parts), _render(parts) or "(top level)", problem)


def _walk(value: Any, path: list[str | int]) -> Iterator[tuple[list[str | int], str]]:
    """Every ``problems()`` of the struct tree, deepest first, with absolute paths."""
    if isinstance(value, msgspec.Struct):
        for f in value.__struct_fields__:
            yield from _walk(getattr(value, f), [*path, f])
        check = getattr(value, "problems", None)
        if check is not None:
            for field, problem in check():
                yield [*path, *_parts(field)], problem
    elif isinstance(value, tuple | list):
        for i, v in enumerate(value):
            yield from _walk(v, [*path, i])


def load_with_doc[T](path: str | Path, tp: type[T]) -> tuple[T, Doc]:
    data, doc = _parse(Path(path))
    try:
        obj = msgspec.convert(data, tp, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        raise _located(e, doc, tp, data) from None
    first = next(_walk(obj, []), None)  # one error, the deepest first: fix it, then the next
    if first is not None:
        raise doc.error(_render(first[0]) or "(top level)", first[1])
    return obj, doc


def convert[T](data: Any, tp: type[T], where: str) -> T:
    """Builtins (such as a build config's ``template``) back into the schema ``tp``; a
    `SpecError` naming ``where`` if they do not fit it."""
    try:
        return msgspec.convert(data, tp, dec_hook=_dec_hook)
    except (msgspec.ValidationError, ValueError) as e:
        raise SpecError(where, None, "", str(e)) from None


def load_yaml[T](path: str | Path, tp: type[T]) -> T:
    """Read one YAML file as the schema ``tp``; every error is a `SpecError` with its line."""
    return load_with_doc(path, tp)[0]


def check_named(doc: Doc, field: str, got: str, want: str, what: str) -> None:
    """A file's ``field`` must equal its folder's (or file's) name."""
    if got != want:
        raise doc.error(field, f"{got!r} must match its {what}'s name {want!r}")
