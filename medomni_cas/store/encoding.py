"""Canonical bytes: the one encoding every object is hashed in.

An object's canonical bytes are a msgpack array ``[kind, version, body]``:

* ``kind`` (str) and ``version`` (int) sit inside the hashed bytes, so bytes of one kind can
  never be read as another (a blob is never a record);
* ``body`` is the payload: raw bytes for a blob, a map for a tree, a msgspec Struct encoded with
  its fields in sorted order and defaults omitted for a record (so a field added later with a
  default leaves every old id unchanged);
* links to other objects are msgpack extension type ``LINK_EXT`` holding the 32-byte id, so
  closure, gc, sync and verify find them without knowing any schema.

Values with more than one encoding for "the same" value are refused: NaN, infinities and
negative zero, and map keys that are not strings. Golden vectors in the tests pin these
rules; changing anything here changes ids, which must never happen after a release.

What comes in is what a reader reads
------------------------------------
Bytes from outside (`Store.put_raw`, a bundle, a remote, and every object fsck checks) pass
`validate_canonical`, which refuses what no reader of this release could read: besides the
canonical rules, maps and arrays nested deeper than `MAX_DEPTH` (no real record comes near
it; a crafted one would exhaust the recursion of every decoder), a kind the store defines
(blob, tree) at a version it does not, a body its kind's check refuses (a tree's entry
names: `register_body_check`, filled by `medomni_cas.store.objects`), and a registered
record kind whose body its class does not decode.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from types import GenericAlias
from typing import Any, ClassVar, cast

import msgspec

from medomni_cas.errors import InvalidObject
from medomni_cas.store.ids import ID_SIZE, ObjectId

__all__ = [
    "BLOB",
    "BLOB_PREFIX",
    "KINDS_GROUP",
    "LINK_EXT",
    "LINK_MARK",
    "MAX_DEPTH",
    "Part",
    "Record",
    "TREE",
    "View",
    "check_kind",
    "decode",
    "decode_body",
    "decode_view",
    "encode",
    "encode_blob_header",
    "encode_object",
    "has_suspect_float",
    "is_kind_name",
    "kind_of",
    "link_array",
    "link_frame",
    "links",
    "record_class",
    "record_modules",
    "register_body_check",
    "too_deep",
    "validate_canonical",
]

LINK_EXT = 1
BLOB = "blob"
TREE = "tree"
_KIND_RE = re.compile(r"[a-z][a-z0-9]*(?:[-.][a-z0-9]+)*\Z")


def _enc_hook(obj: Any) -> Any:
    if type(obj) is ObjectId:
        return msgspec.msgpack.Ext(LINK_EXT, bytes(obj))
    raise TypeError(f"values of type {type(obj).__name__} have no canonical encoding")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == LINK_EXT and len(data) == ID_SIZE:
        # its length is checked here: bytes.__new__ skips ObjectId's own check, a Python
        # call per link of every object decoded
        return bytes.__new__(ObjectId, data)
    raise InvalidObject(f"unknown msgpack extension type {code} (length {len(data)})")


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is ObjectId and type(obj) is ObjectId:
        return obj
    raise NotImplementedError


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook, order="sorted")
_GENERIC = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_ENVELOPE = msgspec.msgpack.Decoder(tuple[str, int, msgspec.Raw])

# A float64 whose exponent bits are all ones (NaN, +-inf), or negative zero. A match may be
# a false positive inside a string or blob; only then do we pay for a full decode.
_SUSPECT_FLOAT = re.compile(rb"\xcb(?:[\x7f\xff][\xf0-\xff]|\x80\x00{7})")
#: The 3 bytes that open every link: msgpack ext 8 of 32 bytes, type `LINK_EXT`.
LINK_MARK = bytes([0xC7, ID_SIZE, LINK_EXT])
#: The bytes that open every blob: fixarray(3), fixstr "blob", positive fixint 1.
BLOB_PREFIX = b"\x93\xa4blob\x01"

#: Deepest nesting of maps and arrays in an object, its ``[kind, version, body]`` envelope
#: counted as one level. Real records nest under 10 levels; a tree is 2.
MAX_DEPTH = 100

# kind -> version -> class, and the kinds that are not records (raw body types)
_REGISTRY: dict[str, dict[int, type[Record]]] = {}
_RAW_KINDS = {BLOB: 1, TREE: 1}
# (kind, version) -> the check of a generically decoded body (links as ObjectId)
_BODY_CHECKS: dict[tuple[str, int], Callable[[Any], object]] = {}
#: The entry-point group naming, for each record kind, the module that defines it.
KINDS_GROUP = "medomni.kinds"
_KIND_MODULES: dict[str, str] | None = None  # kind -> module, read from KINDS_GROUP once
_LOOKED_UP: set[str] = set()  # kinds looked up there already (found or not)


class Part(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every struct embedded in a record (a record's field that is a struct).

    It carries the settings that decide identity, so that no embedded struct depends on
    remembering them: frozen (a part of an immutable object is immutable), kw_only (fields
    are named at every call site) and omit_defaults (an optional field added later does not
    change any existing id). Subclasses pass ``frozen=True, kw_only=True`` again: msgspec
    applies kw_only per class, and type checkers read frozen per class (PEP 681).
    """


class Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every typed object. Subclasses set ``__kind__`` (and ``__version__`` when a
    kind's schema ever changes incompatibly) and are registered by kind.

    frozen: objects are immutable once made; kw_only: fields are named at every call site;
    omit_defaults: an optional field added later does not change any existing id.
    Subclasses pass ``frozen=True, kw_only=True`` again: msgspec applies kw_only per class,
    and type checkers read frozen per class (PEP 681); omit_defaults is inherited.
    """

    __kind__: ClassVar[str]
    __version__: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("__kind__")
        if kind is None:  # an abstract intermediate base
            return
        if not _KIND_RE.match(kind) or kind in _RAW_KINDS:
            raise ValueError(f"bad or reserved record kind {kind!r}")
        versions = _REGISTRY.setdefault(kind, {})
        if (
            cls.__version__ in versions
            and versions[cls.__version__].__qualname__ != cls.__qualname__
        ):
            raise ValueError(f"record kind {kind!r} v{cls.__version__} is already registered")
        versions[cls.__version__] = cls

    def _repr_html_(self) -> str:
        """The fields as a small HTML table, for notebooks (a method: not in the bytes)."""
        from medomni_cas.notebook.html import record_html

        return record_html(self)


def is_kind_name(kind: str) -> bool:
    """Whether ``kind`` is a well-formed kind name: lowercase words joined by ``-`` or ``.``."""
    return _KIND_RE.match(kind) is not None


def record_class(kind: str, version: int) -> type[Record] | None:
    """The class registered for ``kind`` v``version``; a kind not registered yet is looked
    up once in the ``medomni.kinds`` entry points (kind -> the module defining it), and
    that module imported: a store's check decodes every kind it knows by its class (the
    fast path) whatever its caller happened to import."""
    found = _REGISTRY.get(kind, {}).get(version)
    if found is None and kind not in _LOOKED_UP:
        _LOOKED_UP.add(kind)
        if _import_kind(kind):
            found = _REGISTRY.get(kind, {}).get(version)
    return found


def _import_kind(kind: str) -> bool:
    """Import the module an entry point names for ``kind``; whether one was imported."""
    global _KIND_MODULES
    if _KIND_MODULES is None:
        from importlib.metadata import entry_points

        _KIND_MODULES = {ep.name: ep.value for ep in entry_points(group=KINDS_GROUP)}
    module = _KIND_MODULES.get(kind)
    if module is None:
        return False
    import importlib

    try:
        importlib.import_module(module.partition(":")[0])
    except Exception:  # a broken plug-in: its kind is checked generically, as an unknown one
        return False
    return True


def register_body_check(kind: str, version: int, check: Callable[[Any], object]) -> None:
    """Have `validate_canonical` run ``check`` on each generically decoded body of ``kind``
    v``version`` (links as `ObjectId`); it raises `InvalidObject` saying what is wrong. For
    the kinds the store defines without a record class (trees); records are checked by
    their class."""
    _BODY_CHECKS[(kind, version)] = check


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether maps and arrays in ``value`` nest deeper than ``limit`` (``value`` itself one
    level if it is one); iterative, so any depth a decoder produced is measured."""
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth = pop()
        t = type(v)
        if t is dict:
            items: Any = v.values()
        elif t is list or t is tuple:
            items = v
        else:
            continue
        if depth > limit:
            return True
        for item in items:
            ti = type(item)
            if ti is dict or ti is list or ti is tuple:
                push((item, depth + 1))
    return False


# bytes that are not the header of a msgpack map or array (fixmap, fixarray, 16 and 32)
_NOT_CONTAINERS = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))


def _may_be_deep(data: bytes | memoryview) -> bool:
    """False when ``data`` cannot nest deeper than `MAX_DEPTH`: each level needs a header
    byte, and fewer bytes than that could be one (a C-level pass; most records)."""
    return len(bytes(data).translate(None, _NOT_CONTAINERS)) > MAX_DEPTH


def _deep_error(kind: str) -> InvalidObject:
    return InvalidObject(f"{kind} object nests maps and arrays deeper than {MAX_DEPTH} levels")


def record_modules() -> list[str]:
    """The modules that define the registered record classes, for another process to
    import so that it knows the same kinds (``__main__``'s are not importable there)."""
    names = {cls.__module__ for versions in _REGISTRY.values() for cls in versions.values()}
    return sorted(n for n in names if n != "__main__")


def _find_bad_float(value: Any, path: str) -> str | None:
    if type(value) is float:
        if not math.isfinite(value) or (value == 0.0 and math.copysign(1.0, value) < 0):
            return f"{path}: {value!r}"
    elif isinstance(value, dict):
        for k, v in value.items():
            if (bad := _find_bad_float(v, f"{path}.{k}")) is not None:
                return bad
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (bad := _find_bad_float(v, f"{path}[{i}]")) is not None:
                return bad
    return None


def has_suspect_float(data: bytes) -> bool:
    """Whether ``data`` may hold a float that has no canonical form (NaN, an infinity,
    -0.0). False is certain; True may be such bytes inside a string or an id, which only a
    decode tells apart."""
    return _SUSPECT_FLOAT.search(data) is not None


def _check_floats(data: bytes, kind: str) -> None:
    if _SUSPECT_FLOAT.search(data) is None:
        return
    try:
        bad = _find_bad_float(_GENERIC.decode(data)[2], kind)
    except RecursionError:
        raise _deep_error(kind) from None
    if bad is not None:
        raise InvalidObject(f"non-canonical float at {bad} (NaN, infinity and -0.0 are refused)")


def encode_object(kind: str, version: int, body: Any) -> bytes:
    """Canonical bytes of ``[kind, version, body]``; the low-level form of `encode`."""
    try:
        data = _ENCODER.encode((kind, version, body))
    except RecursionError:
        raise _deep_error(kind) from None
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError) as e:
        raise InvalidObject(f"cannot encode {kind} object: {e}") from None
    _check_floats(data, kind)
    return data


def encode(record: Record) -> bytes:
    """Canonical bytes of a registered record."""
    cls = type(record)
    kind = cls.__dict__.get("__kind__")
    if kind is None or not isinstance(record, Record):
        raise InvalidObject(f"{cls.__name__} is not a registered record kind")
    return encode_object(kind, cls.__version__, record)


def encode_blob_header(size: int) -> bytes:
    """The bytes that precede a blob's data in its canonical form (msgpack bin header)."""
    if size < 0x100:
        return BLOB_PREFIX + b"\xc4" + size.to_bytes(1, "big")
    if size < 0x10000:
        return BLOB_PREFIX + b"\xc5" + size.to_bytes(2, "big")
    if size < 0x100000000:
        return BLOB_PREFIX + b"\xc6" + size.to_bytes(4, "big")
    raise InvalidObject(f"a single blob object holds at most 4 GiB, got {size} bytes")


def blob_data(data: bytes | memoryview) -> memoryview:
    """The payload of a blob object's canonical bytes (no copy)."""
    mv = memoryview(data)
    n = len(BLOB_PREFIX)
    if bytes(mv[:n]) != BLOB_PREFIX:
        raise InvalidObject("not a blob object")
    marker = mv[n]
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(marker)
    if width is None:
        raise InvalidObject("blob object has a malformed header")
    size = int.from_bytes(mv[n + 1 : n + 1 + width], "big")
    start = n + 1 + width
    if len(mv) - start != size:
        raise InvalidObject(f"blob object is truncated: {len(mv) - start} of {size} bytes")
    return mv[start:]


def kind_of(data: bytes | memoryview) -> tuple[str, int]:
    """The kind and version of canonical bytes, without decoding the body."""
    if bytes(memoryview(data)[: len(BLOB_PREFIX)]) == BLOB_PREFIX:
        return BLOB, 1
    try:
        kind, version, _ = _ENVELOPE.decode(data)
    except (msgspec.DecodeError, InvalidObject) as e:
        raise InvalidObject(f"not a medomni object: {e}") from None
    return kind, version


def decode(data: bytes | memoryview) -> tuple[str, int, Any]:
    """Decode any object: registered records become their Struct, links become `ObjectId`."""
    kind, version = kind_of(data)
    if kind == BLOB:
        return kind, version, bytes(blob_data(data))
    cls = record_class(kind, version)
    if cls is not None:
        return kind, version, decode_body(data, cls)
    try:
        return kind, version, _GENERIC.decode(data)[2]
    except RecursionError:
        raise _deep_error(kind) from None
    except msgspec.DecodeError as e:
        raise InvalidObject(f"malformed {kind} object: {e}") from None


# a record's envelope, [kind, version, body]; the body's type is the class it is keyed by
_Envelope = tuple[str, int, Any]
_TYPED: dict[type, msgspec.msgpack.Decoder[_Envelope]] = {}


def decode_body[T](data: bytes | memoryview, cls: type[T]) -> T:
    """Decode canonical bytes as a record of ``cls``, checking its kind and version."""
    dec = _TYPED.get(cls)
    if dec is None:
        # GenericAlias(tuple, ...) is tuple[str, int, cls], spelled so that a checker does not
        # read a variable as a type
        dec = _TYPED[cls] = msgspec.msgpack.Decoder(
            GenericAlias(tuple, (str, int, cls)), ext_hook=_ext_hook, dec_hook=_dec_hook
        )
    kind, version = kind_of(data)
    want = (cls.__dict__.get("__kind__"), getattr(cls, "__version__", 1))
    if (kind, version) != want:
        raise InvalidObject(f"object is a {kind} v{version}, not a {want[0]} v{want[1]}")
    try:
        return cast(T, dec.decode(data)[2])  # the decoder _TYPED holds for cls makes a cls
    except RecursionError:
        raise _deep_error(kind) from None
    except msgspec.ValidationError as e:
        raise InvalidObject(f"malformed {kind} object: {e}") from None
    except msgspec.DecodeError as e:
        raise InvalidObject(f"malformed {kind} object: {e}") from None


# -- partial decoding ------------------------------------------------------------------------
class View(msgspec.Struct):
    """Some fields of one record kind, read by `decode_view` without decoding the others.

    Subclasses set ``__kind__`` (and ``__version__``) to those of the record they read, and
    declare the fields they need under the record's names and types: a link as `ObjectId`,
    or ``msgspec.Raw`` to keep a value's bytes (an array of links for `link_array`, say). A
    field the record omits at its default needs the same default here (for a ``Raw``, its
    bytes: ``msgspec.Raw(b"\\x90")`` for an empty array). A view is not a record: it is never
    registered, encoded or hashed.
    """

    __kind__: ClassVar[str]
    __version__: ClassVar[int] = 1


_VIEWS: dict[type, msgspec.msgpack.Decoder[_Envelope]] = {}


def decode_view[V: View](data: bytes | memoryview, view: type[V]) -> V:
    """The fields of ``view`` read from canonical bytes, checking their kind and version
    (`InvalidObject` for another kind, or bytes that do not hold the view's fields)."""
    dec = _VIEWS.get(view)
    if dec is None:
        dec = _VIEWS[view] = msgspec.msgpack.Decoder(
            GenericAlias(tuple, (str, int, view)), ext_hook=_ext_hook, dec_hook=_dec_hook
        )
    want = (view.__kind__, view.__version__)
    try:
        kind, version, body = dec.decode(data)
    except msgspec.DecodeError as e:  # a validation error too: say first if it is the kind
        kind, version = kind_of(data)
        if (kind, version) == want:
            raise InvalidObject(f"malformed {kind} object: {e}") from None
        body = None
    if (kind, version) != want:
        raise InvalidObject(f"object is a {kind} v{version}, not a {want[0]} v{want[1]}")
    return cast(V, body)  # the decoder _VIEWS holds for view makes a view


_ITEM = len(LINK_MARK) + ID_SIZE  # one link in canonical bytes


def link_array(raw: bytes | memoryview) -> bytes:
    """The ids in ``raw``, the bytes of a msgpack array of links (a `View` field typed
    ``msgspec.Raw``), back to back, 32 bytes each: no object per link. `InvalidObject`
    unless ``raw`` is such an array and every item in it is a link."""
    raw = bytes(raw)
    head = raw[0] if raw else -1
    if 0x90 <= head <= 0x9F:  # fixarray
        n, start = head - 0x90, 1
    elif head == 0xDC:  # array 16
        n, start = int.from_bytes(raw[1:3], "big"), 3
    elif head == 0xDD:  # array 32
        n, start = int.from_bytes(raw[1:5], "big"), 5
    else:
        raise InvalidObject("not an array")
    body = raw[start:]
    if len(body) != _ITEM * n or any(
        body[i::_ITEM] != LINK_MARK[i : i + 1] * n for i in range(len(LINK_MARK))
    ):
        raise InvalidObject("not an array of links")
    ids = bytearray(body)
    for width in range(_ITEM, ID_SIZE, -1):  # each item's first byte, in C: 35, 34, 33
        del ids[::width]
    return bytes(ids)


def link_frame(record: Record, field: str) -> tuple[bytes, bytes]:
    """The canonical bytes of ``record`` before and after the 32 bytes of the id in
    ``field``: ``head + id + tail`` is the record with any other id there, and ``head`` ends
    with the link's `LINK_MARK`. Fields are in the bytes sorted by name and a link has a
    fixed length, so no other byte depends on that id: a caller hashing many records that
    differ only there makes the frame once. `InvalidObject` if ``field`` holds no link."""
    cls = type(record)
    names = {f.name: f.encode_name for f in msgspec.structs.fields(cls)}
    if field not in names:
        raise ValueError(f"{cls.__name__} has no field {field!r}")
    oid = getattr(record, field)
    if type(oid) is not ObjectId:
        raise InvalidObject(f"{cls.__name__}.{field} holds no link")
    data = encode(record)
    body = _GENERIC.decode(data)[2]  # a map in the order of the bytes
    keys = list(body)
    after = keys[keys.index(names[field]) + 1 :]
    # a map's bytes are its pairs' bytes one after the other
    tail = b"".join(_ENCODER.encode(k) + _ENCODER.encode(body[k]) for k in after)
    cut = len(data) - len(tail)
    if data[cut:] != tail or data[cut - _ITEM : cut] != LINK_MARK + oid:
        raise AssertionError(f"{cls.__name__}.{field}: the link is not where it sorts")
    return data[: cut - ID_SIZE], tail


def _collect(value: Any, out: dict[ObjectId, None]) -> None:
    if type(value) is ObjectId:
        out[value] = None
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, out)
    elif isinstance(value, list):
        for v in value:
            _collect(v, out)


def links(data: bytes | memoryview) -> list[ObjectId]:
    """The ids an object links to, in order of first appearance, without its schema."""
    if LINK_MARK not in data:  # blobs and leaf records: no decode at all
        return []
    if bytes(memoryview(data)[: len(BLOB_PREFIX)]) == BLOB_PREFIX:
        return []
    out: dict[ObjectId, None] = {}
    try:
        _collect(_GENERIC.decode(data)[2], out)
    except RecursionError:  # stored by a release that did not bound nesting
        raise _deep_error(kind_of(data)[0]) from None
    except msgspec.DecodeError as e:
        raise InvalidObject(f"malformed object: {e}") from None
    return list(out)


def iter_links(values: Any) -> Iterator[ObjectId]:
    out: dict[ObjectId, None] = {}
    _collect(values, out)
    return iter(out)


def validate_canonical(data: bytes | memoryview) -> tuple[str, int]:
    """Check that bytes from outside (a bundle, a remote) are canonical, and readable by
    their kind's reader; return kind, version (`InvalidObject` saying what is wrong).

    The id of any bytes is their hash, so this is not about integrity: it refuses bytes that
    no encoder of ours would write, which would otherwise give a second id to one value,
    and bytes that a reader would refuse (see the module's docstring), which would
    otherwise be stored, pass checks and fail whoever reads them.
    """
    kind, version = kind_of(data)
    if kind == BLOB:
        blob_data(data)
        return kind, version
    if not _KIND_RE.match(kind) or version < 0:
        raise InvalidObject(f"bad kind or version in object header: {kind!r} v{version}")
    try:
        value = _GENERIC.decode(data)
        if _may_be_deep(data) and too_deep(value):
            raise _deep_error(kind)
        again = _ENCODER.encode(value)
    except RecursionError:
        raise _deep_error(kind) from None
    except (msgspec.DecodeError, TypeError, ValueError) as e:
        if isinstance(e, InvalidObject):
            raise
        raise InvalidObject(f"malformed {kind} object: {e}") from None
    if again != bytes(data):
        raise InvalidObject(f"{kind} object is not in canonical form")
    _check_floats(again, kind)
    check_kind(kind, version, data, value[2])
    return kind, version


def check_kind(kind: str, version: int, data: bytes | memoryview, body: Any) -> None:
    """The checks of ``kind``'s reader on canonical bytes (``body``: their generic decode,
    links as `ObjectId`): a kind the store defines only at its version, its body check, a
    registered record's class. `InvalidObject` saying what is wrong."""
    raw = _RAW_KINDS.get(kind)
    if raw is not None and version != raw:
        raise InvalidObject(f"{kind} v{version} is not an object kind (only {kind} v{raw})")
    check = _BODY_CHECKS.get((kind, version))
    if check is not None:
        try:
            check(body)
        except ValueError as e:  # InvalidName too, which is not an InvalidObject
            if type(e) is InvalidObject:
                raise
            raise InvalidObject(str(e)) from None
    cls = record_class(kind, version)
    if cls is not None:
        decode_body(data, cls)
