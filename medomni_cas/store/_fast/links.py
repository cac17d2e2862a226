"""How the objects of one kind are read fast, and exactly: views, mirrors, generated readers.

`medomni_cas.store.encoding.links` decodes a whole object and builds an `ObjectId` per link
through a Python hook: exact, and about 10 µs for a run record. Walks and checks spend most
of their time there, so this module reads the same links in a fraction of that. No extension
hook is used: a link comes back as msgspec's own ``Ext`` value.

Mirrors
    A *mirror* of a registered record class (the same fields, defaults and names, links
    typed ``Ext``, unknown fields refused) decodes a whole object. When the class has only
    plain types (no ``Any``), an extension can only be read into a field typed as an id, and
    all such fields are read, so its links are exactly the ones found (a map key given twice
    keeps its last value, as in `encoding.links`). Re-encoding the mirror must give the same
    bytes: that is the canonical check of `encoding.validate_canonical` for such objects,
    with the floats that are not canonical looked for in the bytes of kinds that have a
    float field.

Views
    A kind without a mirror is read by a *view*: a struct of the fields that can hold a
    link, the others skipped without being built. A newer writer may have added a link
    field the view does not know, so the links found are counted against the link marks in
    the bytes (`encoding.LINK_MARK`; it cannot overlap itself): fewer links than marks, and
    the object is decoded in full instead. A mark inside some other value only costs that
    full decode, never a link.

Readers
    Each kind's links are read by a function generated for its class (`_compile`): straight-
    line code per field. `fast_links` reads one object (view, then full decode); batches are
    `medomni_cas.store._fast.groups`'s.
"""

from __future__ import annotations

import keyword
import types
import typing
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import attrgetter, itemgetter
from types import GenericAlias
from typing import Any, cast

import msgspec

from medomni_cas.errors import InvalidName, InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ID_SIZE, ObjectId
from medomni_cas.store.objects import check_entry_name

__all__ = [
    "BLOB_PREFIX",
    "BODY",
    "DATA",
    "DECODE_ERRORS",
    "LINK_MARK",
    "Kind",
    "fast_links",
    "header_of",
    "is_header",
    "kind_of_header",
]

LINK_MARK = encoding.LINK_MARK
BLOB_PREFIX = encoding.BLOB_PREFIX
_Ext = msgspec.msgpack.Ext
_GENERIC = msgspec.msgpack.Decoder()  # no ext_hook: links come back as Ext values
# no enc_hook: an Ext re-encodes as it was read. Mirrors define their fields in sorted
# order, so only maps need sorting: "deterministic" writes the same bytes as the canonical
# encoder's "sorted" for them, about 1.5x faster
_MIRROR_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
DECODE_ERRORS = (
    msgspec.DecodeError,
    RecursionError,  # an object nested deeper than any reader goes: the exact path says so
    msgspec.ValidationError,
    IndexError,
    KeyError,
    TypeError,
    ValueError,
)
BODY = itemgetter(2)
DATA = attrgetter("data")


# how a field holds links: an id (or None), a tuple or list of ids, or anything else
_ONE, _MANY, _OTHER = "one", "many", "other"
# extract(bodies, owners, exts, exts_owners): append every link extension of each body
_Extract = Callable[[Iterable[Any], Iterable[int], list[Any], list[int]], None]
# (without owners, with owners): reading the link fields of a batch of bodies
_Readers = tuple[_Extract, _Extract]
# decodes [kind, version, body]; GenericAlias(tuple, (str, int, T)) spells tuple[str, int, T]
# for a T made at run time, which a checker would read as a variable used as a type
_Decoder = msgspec.msgpack.Decoder[tuple[str, int, Any]]
# check(values, datas, owners, exts, of, doubtful): the mirror check of a group (below)
_Check = Callable[
    [Iterable[Any], Iterable[bytes], Iterable[int], list[Any], list[int], list[int]], None
]


class Kind:
    """How the objects of one kind and version (one header) are read."""

    __slots__ = ("check", "floats", "has_links", "links", "mirror", "mirror_links", "view")
    view: _Decoder | None
    links: _Readers
    mirror: _Decoder | None
    mirror_links: _Readers
    check: tuple[_Check, _Check] | None

    def __init__(
        self,
        view: tuple[_Decoder, _Readers] | None,
        mirror: tuple[_Decoder, _Readers, tuple[_Check, _Check]] | None,
        has_links: bool = True,
        floats: bool = True,
    ) -> None:
        # [kind, version, the link fields], and how to read them (without, with owners);
        # None: read generically
        self.view, self.links = view or (None, (_no_links, _no_links))
        # [kind, version, the whole body] with links as Ext, how to read their links, and how
        # to check it is canonical; None: each object has the full check
        self.mirror, self.mirror_links, self.check = mirror or (None, (_no_links, _no_links), None)
        self.has_links = has_links  # whether the class has a field that can hold a link
        self.floats = floats  # whether the mirror has a field that can hold a float


def _no_links(bodies: Iterable[Any], owners: Iterable[int], exts: list[Any], of: list[int]) -> None:
    return None


# header bytes -> how to read that kind: a memo of the record registry (registered kinds
# only: a plug-in may register later), the same for every walk; no answer depends on it
_KINDS: dict[bytes, Kind] = {}


# -- schemas ------------------------------------------------------------------------------------
def _may_hold(tp: Any, leaf: Callable[[Any], bool], seen: set[type]) -> bool:
    """Can a value of type ``tp`` hold a value that ``leaf`` says yes to? Structs, unions and
    containers are looked into (a struct met again higher up adds nothing); literals hold
    none; any other type is asked of ``leaf``."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        if tp in seen:
            return False  # already being asked about, higher up
        seen.add(tp)
        return any(_may_hold(f.type, leaf, seen) for f in msgspec.structs.fields(tp))
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return False
    if origin is not None or isinstance(tp, types.UnionType):
        return any(_may_hold(a, leaf, seen) for a in typing.get_args(tp) if a is not Ellipsis)
    return leaf(tp)


def _link_leaf(tp: Any) -> bool:
    """Can a value of this (non-container) type be a link? Unknown types count as yes."""
    if tp is Any or tp is object:
        return True
    if isinstance(tp, type):
        if issubclass(tp, ObjectId):
            return True
        if tp in (str, int, float, bool, bytes, bytearray, type(None)):
            return False
    return not (isinstance(tp, type) and issubclass(tp, (str, int, float, bytes)))


def _float_leaf(tp: Any) -> bool:
    """Can a value of this (non-container) type be a float? Unknown types count as yes."""
    return not (tp in (str, int, bool, bytes, type(None)) or _is_id(tp))


def _may_link(tp: Any, seen: set[type]) -> bool:
    """Can a value of type ``tp`` hold a link? Unknown types count as yes (safe side)."""
    return _may_hold(tp, _link_leaf, seen)


def _link_fields(cls: type[msgspec.Struct]) -> list[msgspec.structs.FieldInfo]:
    # in the order of the canonical bytes (fields sorted by name), so links come out in the
    # order `encoding.links` gives them and a walk meets objects in the same order
    return sorted(
        (f for f in msgspec.structs.fields(cls) if _may_link(f.type, set())),
        key=lambda f: f.encode_name,
    )


def _is_id(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, ObjectId)


def _holds(tp: Any) -> str:
    """How a field of type ``tp`` holds links: `_ONE`, `_MANY` or `_OTHER`."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union or isinstance(tp, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return _OTHER
        tp = rest[0]
        args = typing.get_args(tp)
    if _is_id(tp):
        return _ONE
    origin = typing.get_origin(tp)
    if origin is tuple and len(args) == 2 and _is_id(args[0]) and args[1] is Ellipsis:
        return _MANY
    if origin is list and len(args) == 1 and _is_id(args[0]):
        return _MANY
    return _OTHER


def _nested(tp: Any) -> type[msgspec.Struct] | None:
    """The struct class a field of type ``tp`` (or ``tp | None``) holds, if it is one that
    views and mirrors decode as a struct of their own."""
    inner = _strip_none(tp)
    if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
        config = inner.__struct_config__
        if not config.array_like and config.tag is None:
            return inner
    return None


def _field_code(
    var: str, cls: type[msgspec.Struct], depth: int, generic: bool, owned: bool
) -> list[str]:
    """Straight-line code appending the links in the link fields of ``var`` (a ``cls``),
    and (``owned``) the owner ``i`` of each."""
    pad = "    " * (depth + 2)
    lines: list[str] = []
    for f in _link_fields(cls):
        if not f.name.isidentifier() or keyword.iskeyword(f.name):
            raise ValueError(f"not an attribute name: {f.name!r}")
        v = f"v{depth}"
        lines.append(f"{pad}{v} = {var}.{f.name}")
        holds = _OTHER if generic else _holds(f.type)
        nested = None if generic else _nested(f.type)
        if holds == _ONE:
            lines.append(f"{pad}if {v} is not None: add({v})" + ("; own(i)" if owned else ""))
        elif holds == _MANY:
            own = f"; owns(repeat(i, len({v})))" if owned else ""
            lines.append(f"{pad}if {v}: more({v}){own}")
        elif nested is not None and depth < 4:
            inner = _field_code(v, nested, depth + 1, generic, owned)
            lines += [f"{pad}if {v} is not None:", *inner] if inner else []
        elif owned:
            lines.append(
                f"{pad}if {v} is not None and (n := collect({v}, exts)): owns(repeat(i, n))"
            )
        else:
            lines.append(f"{pad}if {v} is not None: collect({v}, exts)")
    return lines


def _compile(head: list[str], body: list[str], **names: Any) -> Callable[..., None]:
    """Define the function written as ``head`` and ``body``. Walks and checks spend their
    time in its loop, so it is straight-line code per field of one kind: no inner loop over
    fields, no call per field (several times faster than a generic walk of each body). Only
    attribute names (checked to be identifiers) come from outside."""
    namespace: dict[str, Any] = {"repeat": repeat, "collect": _collect_exts, **names}
    exec("\n".join([*head, *body]), namespace)
    f: Callable[..., None] = namespace["f"]
    return f


_HEAD = "    add, own, more, owns = exts.append, of.append, exts.extend, of.extend"


def _links_readers(cls: type[msgspec.Struct], *, generic: bool = False) -> _Readers:
    """``f(bodies, owners, exts, of)``: append the link extensions of each of ``bodies``
    (views or mirrors of ``cls``) to ``exts``; the second (owned) also appends the owner of
    each to ``of``, from ``owners`` (about a quarter slower: a walk that needs only the
    links uses the first)."""
    out: list[_Extract] = []
    for owned in (False, True):
        body = _field_code("b", cls, 0, generic, owned)
        loop = "    for i, b in zip(owners, bodies):" if owned else "    for b in bodies:"
        out.append(
            _compile(["def f(bodies, owners, exts, of):", _HEAD, loop], body) if body else _no_links
        )
    return out[0], out[1]


def _mirror_checkers(cls: type[msgspec.Struct]) -> tuple[_Check, _Check]:
    """``f(values, datas, owners, exts, of, doubtful)``: each of ``values`` (a decoded
    mirror) must re-encode as its bytes (else its owner is doubtful); the links of those
    that do are appended, as `_links_readers` does (with owners, the second)."""
    head = [
        "def f(values, datas, owners, exts, of, doubtful):",
        _HEAD,
        "    again = bytearray()",  # re-encoded into one buffer: no allocation per object
        "    for i, value, data in zip(owners, values, datas):",
        "        encode_into(value, again)",
        "        if again != data:",
        "            doubtful.append(i)",
        "            continue",
        "        b = value[2]",
    ]
    plain, owned = (
        _compile(
            head,
            _field_code("b", cls, 0, False, o) or ["        pass"],
            encode_into=_MIRROR_ENCODER.encode_into,
        )
        for o in (False, True)
    )
    return plain, owned


def _view_type(tp: Any, holds: str) -> Any:
    """The type a view decodes a link field as: links as ``Ext`` (an id as an id, a struct
    as its own view), ``Any`` (decoded generically) for whatever else can hold one."""
    if holds == _ONE:
        return _Ext | None
    if holds == _MANY:
        many = tuple[_Ext, ...] if typing.get_origin(_strip_none(tp)) is tuple else list[_Ext]
        return many | None
    inner = _strip_none(tp)
    if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
        config = inner.__struct_config__
        if not config.array_like and config.tag is None:
            return _view_struct(inner) | None
    return Any


def _strip_none(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Union or isinstance(tp, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def _view_struct(cls: type[msgspec.Struct]) -> type:
    """A struct of the link fields of ``cls``, each optional (a newer writer may drop one)."""
    fields = _link_fields(cls)
    return msgspec.defstruct(
        f"_{cls.__name__}Links",
        [(f.name, _view_type(f.type, _holds(f.type)), None) for f in fields],
        rename={f.name: f.encode_name for f in fields},
        kw_only=True,
        gc=False,
    )


def _view(cls: type[msgspec.Struct]) -> tuple[_Decoder, _Readers] | None:
    fields = _link_fields(cls)
    if not fields:
        return None  # links in a kind whose class has no place for one: read generically
    try:
        dec = msgspec.msgpack.Decoder(GenericAlias(tuple, (str, int, _view_struct(cls))))
        return dec, _links_readers(cls)
    except (TypeError, ValueError):  # a union msgspec cannot decode as typed: all generic
        view = msgspec.defstruct(
            f"_{cls.__name__}AnyLinks",
            [(f.name, Any, None) for f in fields],
            rename={f.name: f.encode_name for f in fields},
            kw_only=True,
        )
        generic = msgspec.msgpack.Decoder(GenericAlias(tuple, (str, int, view)))
        return generic, _links_readers(cls, generic=True)


class _NoMirror(Exception):
    """A type the mirror cannot stand in for exactly (``Any``, a tagged struct, a set…)."""


_PLAIN = (str, int, float, bool, bytes, type(None))


def _mirror_type(tp: Any, memo: dict[type, type | None]) -> Any:
    """``tp`` with every id typed ``Ext`` and every struct mirrored; `_NoMirror` for types
    whose decoding could accept what the generic check refuses, or change a value."""
    if isinstance(tp, type):
        if issubclass(tp, ObjectId):
            return _Ext
        if issubclass(tp, msgspec.Struct):
            return _mirror_struct(tp, memo)
        if tp in _PLAIN:
            return tp
        raise _NoMirror(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return tp
    if origin is typing.Union or isinstance(tp, types.UnionType):
        return typing.Union[tuple(_mirror_type(a, memo) for a in args)]  # noqa: UP007
    if origin is tuple:
        return GenericAlias(
            tuple, tuple(a if a is Ellipsis else _mirror_type(a, memo) for a in args)
        )
    if origin is list and len(args) == 1:
        return GenericAlias(list, (_mirror_type(args[0], memo),))
    if origin is dict and len(args) == 2 and args[0] is str:
        return GenericAlias(dict, (str, _mirror_type(args[1], memo)))
    raise _NoMirror(tp)


def _mirror_struct(cls: type[msgspec.Struct], memo: dict[type, type | None]) -> type:
    if cls in memo:
        got = memo[cls]
        if got is None:  # a struct that contains itself: not worth a mirror
            raise _NoMirror(cls)
        return got
    config = cls.__struct_config__
    if config.array_like or config.tag is not None:
        raise _NoMirror(cls)
    memo[cls] = None
    spec: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    # fields in the order of the bytes: msgspec finds each next field where it expects it
    # (about 2x faster to decode than in the class's order)
    for f in sorted(msgspec.structs.fields(cls), key=lambda f: f.encode_name):
        tp = _mirror_type(f.type, memo)
        if f.default_factory is not msgspec.NODEFAULT:
            spec.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        elif f.default is msgspec.NODEFAULT:
            spec.append((f.name, tp))
        elif isinstance(f.default, ObjectId | msgspec.Struct):
            raise _NoMirror(cls)  # a default the mirror would hold in another type
        else:
            spec.append((f.name, tp, f.default))
    mirror = msgspec.defstruct(
        f"_{cls.__name__}Mirror",
        spec,
        rename={f.name: f.encode_name for f in msgspec.structs.fields(cls)},
        kw_only=True,
        omit_defaults=config.omit_defaults,
        forbid_unknown_fields=True,  # a field this class does not know may hold a link
        gc=False,
    )
    memo[cls] = mirror
    return mirror


def _has_float(tp: Any, seen: set[type]) -> bool:
    """Can a value of type ``tp`` hold a float? (Unknown types count as yes.)"""
    return _may_hold(tp, _float_leaf, seen)


def _mirror(
    cls: type[msgspec.Struct],
) -> tuple[_Decoder, _Readers, tuple[_Check, _Check]] | None:
    try:
        dec = msgspec.msgpack.Decoder(GenericAlias(tuple, (str, int, _mirror_struct(cls, {}))))
        return dec, _links_readers(cls), _mirror_checkers(cls)
    except (_NoMirror, TypeError, ValueError):  # a type msgspec cannot decode as given
        return None


def _tree_links(
    bodies: Iterable[Any], owners: Iterable[int], exts: list[Any], of: list[int]
) -> None:
    for i, body in zip(owners, bodies, strict=False):
        exts.extend(body.values())
        of.extend(repeat(i, len(body)))


def _tree_check(
    values: Iterable[Any],
    datas: Iterable[bytes],
    owners: Iterable[int],
    exts: list[Any],
    of: list[int],
    doubtful: list[int],
) -> None:
    encode_into, again = _MIRROR_ENCODER.encode_into, bytearray()
    for i, value, data in zip(owners, values, datas, strict=False):
        encode_into(value, again)
        if again != data or not _names_ok(value[2]):
            doubtful.append(i)
            continue
        exts.extend(value[2].values())
        of.extend(repeat(i, len(value[2])))


def _names_ok(entries: dict[str, Any]) -> bool:
    """Whether every entry name of a tree passes `check_entry_name` (the full check says
    which one does not)."""
    try:
        for name in entries:
            check_entry_name(name)
    except InvalidName:
        return False
    return True


def _tree_kind() -> Kind:
    dec = msgspec.msgpack.Decoder(tuple[str, int, dict[str, _Ext]])
    # with owners both ways (trees are few): a caller without owners ignores them
    return Kind(
        (dec, (_tree_links, _tree_links)),
        (dec, (_tree_links, _tree_links), (_tree_check, _tree_check)),
    )


def is_header(head: bytes) -> bool:
    """Whether ``head`` is a whole header of canonical bytes: fixarray(3), the kind as a
    fixstr (kinds are short) and the version as a positive fixint. Then an object whose
    bytes start with it is of that kind and version, and of no other."""
    return (
        len(head) >= 4
        and head[0] == 0x93
        and 0xA0 <= head[1] <= 0xBF
        and head[-1] < 0x80
        and len(head) == head[1] - 0xA0 + 3
    )


def kind_of_header(head: bytes) -> Kind | None:
    """How to read objects opening with ``head``; None: one at a time, generically."""
    got = _KINDS.get(head)
    if got is not None:
        return got
    if not is_header(head):
        return None  # read one object at a time
    try:
        kind = head[2:-1].decode()
    except UnicodeDecodeError:
        return None
    version = head[-1]
    if kind == TREE and version == 1:
        got = _tree_kind()
    elif kind == BLOB or not encoding.is_kind_name(kind):
        return None
    else:
        cls = encoding.record_class(kind, version)
        if cls is None:
            return None  # not registered (yet: a plug-in may register it later)
        got = Kind(_view(cls), _mirror(cls), bool(_link_fields(cls)), _has_float(cls, set()))
        if hasattr(cls, "__post_init__"):
            # the class checks more than its fields' types (a chunked blob's sizes), which a
            # mirror does not: its objects get the full check, which decodes them by it
            got.check = None
    _KINDS[head] = got
    return got


# -- one object ------------------------------------------------------------------------------
def _collect_exts(value: object, out: list[_Ext]) -> int:
    """Append every ``Ext`` inside ``value`` (structs, maps and arrays nest); how many."""
    t = type(value)
    if t is _Ext:
        out.append(cast("_Ext", value))  # t is _Ext
        return 1
    if t is tuple or t is list:
        items: Any = value
    elif t is dict:
        items = cast("dict[Any, Any]", value).values()
    elif isinstance(value, msgspec.Struct):
        items = msgspec.structs.astuple(value)
    else:
        return 0
    n = 0
    for v in items:
        if type(v) is _Ext:
            out.append(v)
            n += 1
        elif v is not None:
            n += _collect_exts(v, out)
    return n


def _ids_or_raise(exts: list[_Ext]) -> list[bytes]:
    """The ids of ``exts``; `InvalidObject` for an extension that is not a link."""
    for v in exts:
        if v.code != encoding.LINK_EXT or len(v.data) != ID_SIZE:  # type: ignore[arg-type]  # msgspec's stub: Ext.data is a Buffer (decoded: bytes)
            size = len(v.data)  # type: ignore[arg-type]  # msgspec's stub: Ext.data is a Buffer (decoded: bytes)
            raise InvalidObject(f"unknown msgpack extension type {v.code} ({size} B)")
    return list(map(DATA, exts))


def _links_of_full_decode(data: bytes) -> list[bytes]:
    out: list[_Ext] = []
    try:
        _collect_exts(_GENERIC.decode(data)[2], out)
    except RecursionError:  # stored by a release that did not bound nesting
        encoding.links(data)  # raises its error, which names the kind and the limit
        raise
    except DECODE_ERRORS as e:
        raise InvalidObject(f"malformed object: {e}") from None
    return _ids_or_raise(out)


def header_of(data: bytes) -> bytes:
    n = data[1] - 0xA0 + 3 if len(data) > 1 else 0
    return data[:n]


def fast_links(data: bytes) -> list[bytes]:
    """The ids of every link in ``data`` (an object's canonical bytes), repeats included."""
    marks = data.count(LINK_MARK)
    if not marks or data.startswith(BLOB_PREFIX):
        return []
    kind = kind_of_header(header_of(data))
    if kind is not None and kind.view is not None:
        try:
            out: list[_Ext] = []
            kind.links[0]((kind.view.decode(data)[2],), (0,), out, [])
            if len(out) == marks:
                return _ids_or_raise(out)
        except (*DECODE_ERRORS, InvalidObject):
            pass  # the exact path below says what is wrong, if anything is
    return _links_of_full_decode(data)
