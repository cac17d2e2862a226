"""Finding links fast, and exactly, for walks and checks that read millions of objects.

`medomni_cas.store.encoding.links` decodes a whole object and builds an `ObjectId` per link
through a Python hook: exact, and about 10 µs for a run record. Walks and verification spend
most of their time there, so this module finds the same links in a fraction of that. No
extension hook is used: a link comes back as msgspec's own ``Ext`` value.

* A *mirror* of a registered record class (the same fields, defaults and names, links typed
  ``Ext``, unknown fields refused) decodes a whole object. When the class has only plain
  types (no ``Any``), an extension can only be read into a field typed as an id, and all
  such fields are read, so its links are exactly the ones found (a map key given twice keeps
  its last value, as in `encoding.links`). Re-encoding the mirror must give the same bytes:
  that is the canonical check of `encoding.validate_canonical` for such objects, with the
  floats that are not canonical looked for in the bytes of kinds that have a float field.
* A kind without a mirror is read by a *view*: a struct of the fields that can hold a link,
  the others skipped without being built. A newer writer may have added a link field the
  view does not know, so the links found are counted against the link marks in the bytes
  (each link is the 3-byte header ``c7 20 01`` and its id; the header cannot overlap
  itself): fewer links than marks, and the object is decoded in full instead. A mark inside
  some other value only costs that full decode, never a link.
* Anything either cannot affirm is read one object at a time, by `fast_links` (view, then
  generic decode) or, for the canonical check, by `encoding.validate_canonical`.

A batch is worked in a few C-level passes (`map` over it) rather than a Python step per
object: objects are grouped by their header bytes (envelope, kind, version), each group is
decoded by one decoder and its links read by a function generated for its class (straight-
line code per field). `mismatches` re-hashes a batch, `unseen` and `new_links` drop the links
a walk has met before.
"""

from __future__ import annotations

import keyword
import operator
import types
import typing
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import compress, filterfalse, repeat
from operator import attrgetter, getitem, itemgetter, sub
from typing import Any

import blake3
import msgspec

from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ID_SIZE, ObjectId

__all__ = [
    "BLOB_PREFIX",
    "LINK_MARK",
    "batch_check",
    "batch_links",
    "fast_links",
    "mismatches",
    "new_links",
    "unseen",
]

LINK_MARK = bytes([0xC7, ID_SIZE, encoding.LINK_EXT])
BLOB_PREFIX = encoding.encode_blob_header(0)[:-2]  # envelope, "blob", version 1
_Ext = msgspec.msgpack.Ext
_GENERIC = msgspec.msgpack.Decoder()  # no ext_hook: links come back as Ext values
# no enc_hook: an Ext re-encodes as it was read. Mirrors define their fields in sorted
# order, so only maps need sorting: "deterministic" writes the same bytes as the canonical
# encoder's "sorted" for them, about 1.5x faster
_MIRROR_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
_BLOB_ENVELOPE = msgspec.msgpack.Decoder(tuple[str, int, msgspec.Raw])
_BLOB_MARKERS = {0xC4, 0xC5, 0xC6}  # bin 8, 16 and 32: the only bodies a blob has
_DECODE_ERRORS = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    IndexError,
    KeyError,
    TypeError,
    ValueError,
)
_BODY = itemgetter(2)
_CODE = attrgetter("code")
_DATA = attrgetter("data")


# how a field holds links: an id (or None), a tuple or list of ids, or anything else
_ONE, _MANY, _OTHER = "one", "many", "other"
# extract(bodies, owners, exts, exts_owners): append every link extension of each body
_Extract = Callable[[Iterable[Any], Iterable[int], list[Any], list[int]], None]
# (without owners, with owners): reading the link fields of a batch of bodies
_Readers = tuple[_Extract, _Extract]
# check(values, datas, owners, exts, of, doubtful): the mirror check of a group (below)
_Check = Callable[
    [Iterable[Any], Iterable[bytes], Iterable[int], list[Any], list[int], list[int]], None
]


class _Kind:
    """How the objects of one kind and version (one header) are read."""

    __slots__ = ("check", "floats", "has_links", "links", "mirror", "mirror_links", "view")

    def __init__(
        self,
        view: tuple[msgspec.msgpack.Decoder, _Readers] | None,
        mirror: tuple[msgspec.msgpack.Decoder, _Readers, tuple[_Check, _Check]] | None,
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


# header bytes -> how to read that kind (registered kinds only: a plug-in may register later)
_KINDS: dict[bytes, _Kind] = {}


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
                f"{pad}if {v} is not None and (n := gather({v}, exts)): owns(repeat(i, n))"
            )
        else:
            lines.append(f"{pad}if {v} is not None: gather({v}, exts)")
    return lines


def _compile(head: list[str], body: list[str], **names: Any) -> Callable[..., None]:
    """Define the function written as ``head`` and ``body``. Walks and checks spend their
    time in its loop, so it is straight-line code per field of one kind: no inner loop over
    fields, no call per field (several times faster than a generic walk of each body). Only
    attribute names (checked to be identifiers) come from outside."""
    namespace: dict[str, Any] = {"repeat": repeat, "gather": _gather, **names}
    exec("\n".join([*head, *body]), namespace)
    return namespace["f"]  # type: ignore[no-any-return]


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


def _view(cls: type[msgspec.Struct]) -> tuple[msgspec.msgpack.Decoder, _Readers] | None:
    fields = _link_fields(cls)
    if not fields:
        return None  # links in a kind whose class has no place for one: read generically
    try:
        dec = msgspec.msgpack.Decoder(tuple[str, int, _view_struct(cls)])
        return dec, _links_readers(cls)
    except (TypeError, ValueError):  # a union msgspec cannot decode as typed: all generic
        view = msgspec.defstruct(
            f"_{cls.__name__}AnyLinks",
            [(f.name, Any, None) for f in fields],
            rename={f.name: f.encode_name for f in fields},
            kw_only=True,
        )
        return msgspec.msgpack.Decoder(tuple[str, int, view]), _links_readers(cls, generic=True)


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
        return tuple[tuple(a if a is Ellipsis else _mirror_type(a, memo) for a in args)]
    if origin is list and len(args) == 1:
        return list[_mirror_type(args[0], memo)]  # type: ignore[misc]
    if origin is dict and len(args) == 2 and args[0] is str:
        return dict[str, _mirror_type(args[1], memo)]  # type: ignore[misc]
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
) -> tuple[msgspec.msgpack.Decoder, _Readers, tuple[_Check, _Check]] | None:
    try:
        dec = msgspec.msgpack.Decoder(tuple[str, int, _mirror_struct(cls, {})])
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
        if again != data:
            doubtful.append(i)
            continue
        exts.extend(value[2].values())
        of.extend(repeat(i, len(value[2])))


def _tree_kind() -> _Kind:
    dec = msgspec.msgpack.Decoder(tuple[str, int, dict[str, _Ext]])
    # with owners both ways (trees are few): a caller without owners ignores them
    return _Kind(
        (dec, (_tree_links, _tree_links)),
        (dec, (_tree_links, _tree_links), (_tree_check, _tree_check)),
    )


def _is_header(head: bytes) -> bool:
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


def _kind(head: bytes) -> _Kind | None:
    """How to read objects opening with ``head``; None: one at a time, generically."""
    got = _KINDS.get(head)
    if got is not None:
        return got
    if not _is_header(head):
        return None  # read one object at a time
    try:
        kind = head[2:-1].decode()
    except UnicodeDecodeError:
        return None
    version = head[-1]
    if kind == TREE and version == 1:
        got = _tree_kind()
    elif kind == BLOB or not encoding._KIND_RE.match(kind):
        return None
    else:
        cls = encoding.record_class(kind, version)
        if cls is None:
            return None  # not registered (yet: a plug-in may register it later)
        got = _Kind(_view(cls), _mirror(cls), bool(_link_fields(cls)), _has_float(cls, set()))
    _KINDS[head] = got
    return got


# -- one object -----------------------------------------------------------------------------
def _gather(value: object, out: list[_Ext]) -> int:
    """Append every ``Ext`` inside ``value`` (structs, maps and arrays nest); how many."""
    t = type(value)
    if t is _Ext:
        out.append(value)  # type: ignore[arg-type]
        return 1
    if t is tuple or t is list:
        items: Any = value
    elif t is dict:
        items = value.values()  # type: ignore[attr-defined]
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
            n += _gather(v, out)
    return n


def _link_ids(exts: list[_Ext]) -> list[bytes]:
    """The ids of ``exts``; `InvalidObject` for an extension that is not a link."""
    for v in exts:
        if v.code != encoding.LINK_EXT or len(v.data) != ID_SIZE:
            raise InvalidObject(f"unknown msgpack extension type {v.code} ({len(v.data)} B)")
    return list(map(_DATA, exts))


def _generic(data: bytes) -> list[bytes]:
    try:
        body = _GENERIC.decode(data)[2]
    except _DECODE_ERRORS as e:
        raise InvalidObject(f"malformed object: {e}") from None
    out: list[_Ext] = []
    _gather(body, out)
    return _link_ids(out)


def _head(data: bytes) -> bytes:
    n = data[1] - 0xA0 + 3 if len(data) > 1 else 0
    return data[:n]


def fast_links(data: bytes) -> list[bytes]:
    """The ids of every link in ``data`` (an object's canonical bytes), repeats included."""
    marks = data.count(LINK_MARK)
    if not marks or data.startswith(BLOB_PREFIX):
        return []
    kind = _kind(_head(data))
    if kind is not None and kind.view is not None:
        try:
            out: list[_Ext] = []
            kind.links[0]((kind.view.decode(data)[2],), (0,), out, [])
            if len(out) == marks:
                return _link_ids(out)
        except (*_DECODE_ERRORS, InvalidObject):
            pass  # the exact path below says what is wrong, if anything is
    return _generic(data)


# -- batches --------------------------------------------------------------------------------
def mismatches(keys: Sequence[bytes], datas: Sequence[bytes]) -> list[int]:
    """The indexes of the ``datas`` that do not hash to their key (none, almost always:
    then the whole check is two C-level passes and one list comparison)."""
    # one hasher, reset after each object: a new one per object costs a quarter more
    hasher = blake3.blake3()
    update, digest, reset = hasher.update, hasher.digest, hasher.reset
    digests: list[bytes] = []
    add = digests.append
    for data in datas:
        update(data)
        add(digest())
        reset()
    if digests == (keys if type(keys) is list else list(keys)):
        return []
    return [i for i, (d, k) in enumerate(zip(digests, keys, strict=True)) if d != k]


def _heads(datas: Sequence[bytes]) -> list[bytes]:
    """Each object's header bytes (meaningful for fixstr kinds only), in a few C passes."""
    try:
        ends = map(sub, map(itemgetter(1), datas), repeat(0xA0 - 3))
        return list(map(getitem, datas, map(slice, repeat(0), ends)))
    except IndexError:  # an object of under 2 bytes
        return list(map(_head, datas))


# headers met in the last batch, the most frequent first: a batch's objects are tried
# against each in turn, one C-level pass per header (a walk meets few kinds at a time). A
# hint only, like a cache: which objects share a header never depends on it
_recent: list[bytes] = []
_Group = tuple[bytes, list[int], list[bytes]]


def _groups(datas: Sequence[bytes]) -> list[_Group]:
    """``(header, indexes, objects)`` for each header that objects of ``datas`` open with."""
    global _recent
    out: list[_Group] = []
    idx, rest = list(range(len(datas))), list(datas)
    for head in _recent:
        hit = list(map(bytes.startswith, rest, repeat(head)))
        if True not in hit:
            break  # the kinds have changed: work the others out one by one
        if False not in hit:
            out.append((head, idx, rest))
            idx, rest = [], []
            break
        out.append((head, list(compress(idx, hit)), list(compress(rest, hit))))
        miss = list(map(operator.not_, hit))
        idx, rest = list(compress(idx, miss)), list(compress(rest, miss))
    if rest:
        out += _grouped(idx, rest)
    # only whole headers: a malformed object's "header" may be b"" or a few bytes that
    # other objects also start with, which would group them with it
    ranked = sorted(out, key=lambda g: -len(g[1]))
    _recent = [head for head, _, _ in ranked if _is_header(head)][:8]
    return out


def _grouped(idx: list[int], datas: list[bytes]) -> list[_Group]:
    groups: dict[bytes, tuple[list[int], list[bytes]]] = {}
    for i, data, head in zip(idx, datas, _heads(datas), strict=True):
        got = groups.get(head)
        if got is None:
            got = groups[head] = ([], [])
        got[0].append(i)
        got[1].append(data)
    return [(head, i, d) for head, (i, d) in groups.items()]


def _ids_of(exts: list[_Ext]) -> list[bytes] | None:
    """The ids of ``exts`` when every one is a link, else None."""
    ids = list(map(_DATA, exts))
    n = len(ids)
    if list(map(_CODE, exts)).count(encoding.LINK_EXT) != n:
        return None
    if list(map(len, ids)).count(ID_SIZE) != n:
        return None
    return ids


def _is_link(v: _Ext) -> bool:
    return v.code == encoding.LINK_EXT and len(v.data) == ID_SIZE


class _Found:
    """Links found in a batch: ``ids[k]`` is linked by the object at index ``owners[k]``;
    without ``owned``, the owners are not kept (a walk that only needs the links)."""

    __slots__ = ("ids", "owned", "owners")

    def __init__(self, owned: bool = True) -> None:
        self.ids: list[bytes] = []
        self.owners: list[int] = []
        self.owned = owned

    def add(
        self,
        exts: list[_Ext],
        owners: list[int] | None,
        marks: tuple[list[int], list[int]] | None,
    ) -> list[int] | None:
        """Add the links of ``exts``, of the objects whose extensions are all links (as many
        as their link marks, with ``marks``: (objects, marks of each)); return the objects
        that are not so. Without ``owners``, all or nothing: None when one is not so (then
        the group is read again with its owners)."""
        ids = _ids_of(exts)
        if ids is not None and (marks is None or len(ids) == sum(marks[1])):
            if self.ids:
                self.ids += ids
                self.owners += owners or ()
            else:  # a batch of one kind (the usual): no copy
                self.ids, self.owners = ids, owners or []
            return []
        if owners is None:
            return None
        bad = {o for v, o in zip(exts, owners, strict=True) if not _is_link(v)}
        if marks is not None:
            found = Counter(owners)
            bad.update(i for i, n in zip(*marks, strict=True) if found[i] != n)
        keep = [o not in bad for o in owners]
        self.ids += map(_DATA, compress(exts, keep))
        if self.owned:
            self.owners += compress(owners, keep)
        return sorted(bad)

    def add_one(self, ids: list[bytes], owner: int) -> None:
        self.ids += ids
        self.owners += repeat(owner, len(ids))

    def in_order(self) -> tuple[list[bytes], list[int]]:
        """Sorted by owner (groups are read one after the other), each owner's in order."""
        owners = self.owners
        if all(map(int.__le__, owners, owners[1:])):
            return self.ids, owners
        order = sorted(range(len(owners)), key=owners.__getitem__)
        return list(map(self.ids.__getitem__, order)), list(map(owners.__getitem__, order))


def new_links(
    parent: dict[bytes, bytes | None], keys: list[bytes], ids: list[bytes], owners: list[int]
) -> list[bytes]:
    """The ``ids`` not in ``parent`` yet, each entered with the key of its first owner.

    A walk meets most links many times (every run links its agent config); this is a few
    dict and set operations in C per batch, not a Python step per link."""
    first = dict(zip(reversed(ids), reversed(owners), strict=True))  # the first owner wins
    new = list(filterfalse(parent.__contains__, first))
    parent.update(zip(new, map(keys.__getitem__, map(first.__getitem__, new)), strict=True))
    return new


def unseen(seen: set[bytes], ids: list[bytes], *, ordered: bool = True) -> Collection[bytes]:
    """The ``ids`` not in ``seen`` (each once), now added to it: C-level passes, the batch's
    own repeats dropped in a small dict or set first so that the large set is asked once
    per id. ``ordered``: in the order of ``ids`` (else in no order, about 15% faster)."""
    if not ordered:
        fresh = set(ids) - seen  # iterates the small set, asking the large one
        seen |= fresh
        return fresh
    new = list(filterfalse(seen.__contains__, dict.fromkeys(ids)))
    seen.update(new)
    return new


def batch_links(
    datas: Sequence[bytes], *, ordered: bool = False, owners: bool = True
) -> tuple[list[bytes], list[int], dict[int, InvalidObject]]:
    """`fast_links` of each of ``datas``: ``(ids, owners, errors)``, where ``ids[k]`` is
    linked by ``datas[owners[k]]`` and ``errors`` holds the objects whose links cannot be
    read. With ``ordered``, links come by owner, each owner's in the order of its bytes;
    without ``owners``, the owners list is empty (and reading is about a fifth faster)."""
    found = _Found(owners or ordered)
    errors: dict[int, InvalidObject] = {}
    for head, idx, group in _groups(datas):
        if head == BLOB_PREFIX:
            continue
        kind = _kind(head)
        if kind is not None and kind.mirror is not None and kind.has_links:
            redo = _mirror_links(kind, group, idx, found, found.owned)
        else:
            redo = _counted_links(kind, group, idx, found, found.owned)
        for i in redo:
            try:
                found.add_one(fast_links(datas[i]), i)
            except InvalidObject as e:
                errors[i] = e
    if ordered:
        found.ids, found.owners = found.in_order()
    return found.ids, found.owners, errors


def _mirror_links(
    kind: _Kind, group: list[bytes], idx: list[int], found: _Found, owned: bool
) -> list[int]:
    """Add the links of a group of one kind read by its mirror; return the indexes of the
    objects to read one at a time.

    No link marks are counted: the mirror types every field (no ``Any``) and refuses unknown
    ones, so an extension can only be read into a field typed as an id, and every such
    field is read; a map key given twice keeps its last value, as in `encoding.links`."""
    assert kind.mirror is not None
    read = kind.mirror_links[owned]
    exts: list[_Ext] = []
    of: list[int] = []
    redo: list[int] = []
    try:
        # decoded one at a time as the reader asks: a body is gone before the next is made,
        # which keeps memory in cache (about 2x faster than decoding the group first)
        read(map(_BODY, map(kind.mirror.decode, group)), idx, exts, of)
    except _DECODE_ERRORS:  # an object not of its class (a newer writer's field, say)
        exts.clear()
        of.clear()
        values, _, fine_idx = _decodable(kind.mirror, group, idx, redo)
        read(map(_BODY, values), fine_idx, exts, of)
    bad = found.add(exts, of if owned else None, None)
    if bad is None:  # an extension that is not a link: again, to know whose
        return _mirror_links(kind, group, idx, found, True)
    return redo + bad


def _decodable(
    decoder: msgspec.msgpack.Decoder, group: list[bytes], idx: list[int], failed: list[int]
) -> tuple[list[Any], list[bytes], list[int]]:
    """The objects of ``group`` that ``decoder`` decodes, decoded (with their bytes and
    indexes); the indexes of the others go to ``failed``. Only after a decode of the whole
    group failed: a Python step per object."""
    values: list[Any] = []
    good: list[bool] = []
    for i, data in zip(idx, group, strict=True):
        try:
            values.append(decoder.decode(data))
            good.append(True)
        except _DECODE_ERRORS:
            failed.append(i)
            good.append(False)
    return values, list(compress(group, good)), list(compress(idx, good))


def _counted_links(
    kind: _Kind | None, group: list[bytes], idx: list[int], found: _Found, owned: bool
) -> list[int]:
    """Add the links of a group of one kind read by its view, which must find as many as
    the objects have link marks; return the indexes of the objects to read one at a time."""
    counts = list(map(bytes.count, group, repeat(LINK_MARK)))
    if not any(counts):
        return []  # leaf records: no decode at all
    if not all(counts):
        idx, group = list(compress(idx, counts)), list(compress(group, counts))
        counts = list(filter(None, counts))
    if kind is None or kind.view is None:
        return idx
    exts: list[_Ext] = []
    of: list[int] = []
    try:
        kind.links[owned](map(_BODY, map(kind.view.decode, group)), idx, exts, of)
    except _DECODE_ERRORS:
        return idx
    bad = found.add(exts, of if owned else None, (idx, counts))
    if bad is None:  # links and marks differ: again, to know whose
        return _counted_links(kind, group, idx, found, True)
    return bad


def batch_check(
    datas: Sequence[bytes], *, owners: bool = True
) -> tuple[list[bytes], list[int], list[int]]:
    """The canonical check of each of ``datas`` and their links: ``(ids, owners, doubtful)``,
    ``ids[k]`` linked by ``datas[owners[k]]``, for every object found canonical; the others
    (``doubtful``, indexes) need `encoding.validate_canonical` and `encoding.links`, which
    say what is wrong with them if anything is. Without ``owners``, that list is empty."""
    found = _Found(owners)
    doubtful: list[int] = []
    for head, idx, group in _groups(datas):
        if head == BLOB_PREFIX:
            doubtful += _blob_doubts(group, idx)
            continue
        kind = _kind(head)
        if kind is None or kind.check is None:
            doubtful += idx
            continue
        doubtful += _mirror_check(kind, group, idx, found, owners)
    return found.ids, found.owners, doubtful


def _blob_doubts(group: list[bytes], idx: list[int]) -> list[int]:
    """`encoding.blob_data`'s check of blobs, in C: their header opens a bin body, and the
    body ends the bytes (the decoder refuses a short body and trailing bytes)."""
    try:
        for _ in map(_BLOB_ENVELOPE.decode, group):
            pass
        if set(map(itemgetter(len(BLOB_PREFIX)), group)) <= _BLOB_MARKERS:
            return []
    except _DECODE_ERRORS:
        pass
    return idx


def _mirror_check(
    kind: _Kind, group: list[bytes], idx: list[int], found: _Found, owned: bool
) -> list[int]:
    """Check a group of one kind by its mirror; add its links; return what is doubtful."""
    assert kind.mirror is not None and kind.check is not None
    check = kind.check[owned]
    doubtful: list[int] = []
    everything, all_idx = group, idx
    # a float that is not canonical (NaN, infinities, -0.0) can only be in a float field,
    # and its bytes are looked for only in kinds that have one (in an id, they are not rare)
    if kind.floats and encoding._SUSPECT_FLOAT.search(b"".join(group)):
        fine = [encoding._SUSPECT_FLOAT.search(d) is None for d in group]
        doubtful = list(compress(idx, map(operator.not_, fine)))
        idx, group = list(compress(idx, fine)), list(compress(group, fine))
    exts: list[_Ext] = []
    of: list[int] = []
    before = len(doubtful)
    try:
        check(map(kind.mirror.decode, group), group, idx, exts, of, doubtful)
    except _DECODE_ERRORS:  # an object not of its class: the others are checked still
        exts.clear()
        of.clear()
        del doubtful[before:]
        values, group, idx = _decodable(kind.mirror, group, idx, doubtful)
        check(values, group, idx, exts, of, doubtful)
    bad = found.add(exts, of if owned else None, None)
    if bad is None:  # an extension that is not a link: again, to know whose
        return _mirror_check(kind, everything, all_idx, found, True)
    return doubtful + bad
