"""A batch at a time: objects grouped by header, each group read by its kind's readers.

A batch is worked in a few C-level passes (`map` over it) rather than a Python step per
object: its objects are grouped by their header bytes (envelope, kind, version), and each
group is decoded by one decoder and its links read by the function generated for its class
(`medomni_cas.store._fast.links`). Whatever a group's reader cannot affirm is read one
object at a time, by `fast_links` or, for the canonical check, by the caller's full check.

Hint
    A `BatchReader` keeps the headers of its last batch, the most frequent first, and tries
    the next batch's objects against each in turn, one C-level pass per header (a walk meets
    few kinds at a time). A hint only, like a cache: which objects share a header never
    depends on it. It is the reader's state, so one walk's batches never steer another's.

Exact
    A reader made with ``exact`` reads every object by the definitions instead
    (`medomni_cas.store._fast.exact`): the switch that keeps the fast paths honest.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from operator import getitem, itemgetter, sub
from typing import Any, cast

import msgspec

from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store._fast import exact as _exact
from medomni_cas.store._fast.links import (
    BLOB_PREFIX,
    BODY,
    DATA,
    DECODE_ERRORS,
    LINK_MARK,
    Kind,
    fast_links,
    header_of,
    is_header,
    kind_of_header,
)
from medomni_cas.store.ids import ID_SIZE

__all__ = ["BatchReader"]

_Ext = msgspec.msgpack.Ext
_CODE = operator.attrgetter("code")
_BLOB_ENVELOPE = msgspec.msgpack.Decoder(tuple[str, int, msgspec.Raw])
_BLOB_MARKERS = {0xC4, 0xC5, 0xC6}  # bin 8, 16 and 32: the only bodies a blob has
_HINTS = 8  # headers kept for the next batch
# (header, indexes, objects): the objects of a batch that open with one header
_Group = tuple[bytes, list[int], list[bytes]]


class BatchReader:
    """Reads the links of batches, and checks them canonical, a group of one kind at a
    time; keeps its last batch's headers as a hint for the next (one reader per walk).
    ``exact``: every object by the definitions (None: as `exact.exact_checks` says)."""

    def __init__(self, exact: bool | None = None) -> None:
        self.exact = _exact.exact_checks() if exact is None else exact
        self._recent: list[bytes] = []

    def links(
        self, datas: Sequence[bytes], *, ordered: bool = False, owners: bool = True
    ) -> tuple[list[bytes], list[int], dict[int, InvalidObject]]:
        """`fast_links` of each of ``datas``: ``(ids, owners, errors)``, where ``ids[k]`` is
        linked by ``datas[owners[k]]`` and ``errors`` holds the objects whose links cannot
        be read. With ``ordered``, links come by owner, each owner's in the order of its
        bytes; without ``owners``, the owners list is empty (reading is a fifth faster)."""
        if self.exact:
            return _exact.links(datas, owners=owners or ordered)
        found = _Found(owners or ordered)
        errors: dict[int, InvalidObject] = {}
        for head, idx, group in self._group(datas):
            if head == BLOB_PREFIX:
                continue
            kind = kind_of_header(head)
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

    def check(
        self, datas: Sequence[bytes], *, owners: bool = True
    ) -> tuple[list[bytes], list[int], list[int]]:
        """The canonical check of each of ``datas`` and their links: ``(ids, owners,
        doubtful)``, ``ids[k]`` linked by ``datas[owners[k]]``, for every object found
        canonical; the others (``doubtful``, indexes) need `encoding.validate_canonical`
        and `encoding.links`, which say what is wrong with them if anything is. Without
        ``owners``, that list is empty."""
        if self.exact:
            return [], [], list(range(len(datas)))  # the full check of each, by the caller
        found = _Found(owners)
        doubtful: list[int] = []
        for head, idx, group in self._group(datas):
            if head == BLOB_PREFIX:
                doubtful += _blob_doubts(group, idx)
                continue
            kind = kind_of_header(head)
            if kind is None or kind.check is None:
                doubtful += idx
                continue
            doubtful += _mirror_check(kind, group, idx, found, owners)
        return found.ids, found.owners, doubtful

    def _group(self, datas: Sequence[bytes]) -> list[_Group]:
        """``(header, indexes, objects)`` for each header that objects of ``datas`` open
        with: tried against the last batch's headers first, then worked out one by one."""
        out: list[_Group] = []
        idx, rest = list(range(len(datas))), list(datas)
        for head in self._recent:
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
            out += _group_by_header(idx, rest)
        # only whole headers: a malformed object's "header" may be b"" or a few bytes that
        # other objects also start with, which would group them with it
        ranked = sorted(out, key=lambda g: -len(g[1]))
        self._recent = [head for head, _, _ in ranked if is_header(head)][:_HINTS]
        return out


def _headers_of(datas: Sequence[bytes]) -> list[bytes]:
    """Each object's header bytes (meaningful for fixstr kinds only), in a few C passes."""
    try:
        ends = map(sub, map(itemgetter(1), datas), repeat(0xA0 - 3))
        heads = list(map(getitem, datas, map(slice, repeat(0), ends)))
        return cast("list[bytes]", heads)  # a slice of bytes (typeshed: of a Sequence)
    except IndexError:  # an object of under 2 bytes
        return list(map(header_of, datas))


def _group_by_header(idx: list[int], datas: list[bytes]) -> list[_Group]:
    groups: dict[bytes, tuple[list[int], list[bytes]]] = {}
    for i, data, head in zip(idx, datas, _headers_of(datas), strict=True):
        got = groups.get(head)
        if got is None:
            got = groups[head] = ([], [])
        got[0].append(i)
        got[1].append(data)
    return [(head, i, d) for head, (i, d) in groups.items()]


def _ids_if_all_links(exts: list[_Ext]) -> list[bytes] | None:
    """The ids of ``exts`` when every one is a link, else None."""
    ids = list(map(DATA, exts))
    n = len(ids)
    if list(map(_CODE, exts)).count(encoding.LINK_EXT) != n:
        return None
    if list(map(len, ids)).count(ID_SIZE) != n:
        return None
    return ids


def _is_link(v: _Ext) -> bool:
    return v.code == encoding.LINK_EXT and len(v.data) == ID_SIZE  # type: ignore[arg-type]  # msgspec's stub: Ext.data is a Buffer (decoded: bytes)


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
        ids = _ids_if_all_links(exts)
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
        self.ids += map(DATA, compress(exts, keep))
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


# -- one group of a kind ------------------------------------------------------------------
def _mirror_links(
    kind: Kind, group: list[bytes], idx: list[int], found: _Found, owned: bool
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
        read(map(BODY, map(kind.mirror.decode, group)), idx, exts, of)
    except DECODE_ERRORS:  # an object not of its class (a newer writer's field, say)
        exts.clear()
        of.clear()
        values, _, fine_idx = _decodable(kind.mirror, group, idx, redo)
        read(map(BODY, values), fine_idx, exts, of)
    bad = found.add(exts, of if owned else None, None)
    if bad is None:  # an extension that is not a link: again, to know whose
        return _mirror_links(kind, group, idx, found, True)
    return redo + bad


def _decodable(
    decoder: msgspec.msgpack.Decoder[Any], group: list[bytes], idx: list[int], failed: list[int]
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
        except DECODE_ERRORS:
            failed.append(i)
            good.append(False)
    return values, list(compress(group, good)), list(compress(idx, good))


def _counted_links(
    kind: Kind | None, group: list[bytes], idx: list[int], found: _Found, owned: bool
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
        kind.links[owned](map(BODY, map(kind.view.decode, group)), idx, exts, of)
    except DECODE_ERRORS:
        return idx
    bad = found.add(exts, of if owned else None, (idx, counts))
    if bad is None:  # links and marks differ: again, to know whose
        return _counted_links(kind, group, idx, found, True)
    return bad


def _blob_doubts(group: list[bytes], idx: list[int]) -> list[int]:
    """`encoding.blob_data`'s check of blobs, in C: their header opens a bin body, and the
    body ends the bytes (the decoder refuses a short body and trailing bytes)."""
    try:
        for _ in map(_BLOB_ENVELOPE.decode, group):
            pass
        if set(map(itemgetter(len(BLOB_PREFIX)), group)) <= _BLOB_MARKERS:
            return []
    except DECODE_ERRORS:
        pass
    return idx


def _mirror_check(
    kind: Kind, group: list[bytes], idx: list[int], found: _Found, owned: bool
) -> list[int]:
    """Check a group of one kind by its mirror; add its links; return what is doubtful."""
    assert kind.mirror is not None and kind.check is not None
    check = kind.check[owned]
    doubtful: list[int] = []
    everything, all_idx = group, idx
    # a float that is not canonical (NaN, infinities, -0.0) can only be in a float field,
    # and its bytes are looked for only in kinds that have one (in an id, they are not rare)
    if kind.floats and encoding.has_suspect_float(b"".join(group)):
        fine = [not encoding.has_suspect_float(d) for d in group]
        doubtful = list(compress(idx, map(operator.not_, fine)))
        idx, group = list(compress(idx, fine)), list(compress(group, fine))
    exts: list[_Ext] = []
    of: list[int] = []
    before = len(doubtful)
    try:
        check(map(kind.mirror.decode, group), group, idx, exts, of, doubtful)
    except DECODE_ERRORS:  # an object not of its class: the others are checked still
        exts.clear()
        of.clear()
        del doubtful[before:]
        values, group, idx = _decodable(kind.mirror, group, idx, doubtful)
        check(values, group, idx, exts, of, doubtful)
    bad = found.add(exts, of if owned else None, None)
    if bad is None:  # an extension that is not a link: again, to know whose
        return _mirror_check(kind, everything, all_idx, found, True)
    return doubtful + bad
