"""The provenance tree of any object: its links, followed down, each node naming its object.

From a `Result` the tree reaches the task set, the set build and, per pair and arm, the
build config, the build result, its content and answer key; the jobs, their agent configs
and prediction columns. It is made from the links themselves (`fields.links`), so it holds
for every kind, a `Comparison` or a plug-in's record as much as a result. What would make a
tree of thousands of nodes is summarised instead: a job's runs are one node linking to the
job's paged run list, a list of more than `FAN` links one node linking to its object, and
trees (evidence, logs) are leaves. An object met again is shown once, then marked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from medomni_cas.errors import InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNKED
from medomni_cas.store.store import Store
from medomni_cas.view.fields import describe, links, plain
from medomni_cas.view.queries import Hidden, JobHead

__all__ = ["DEPTH", "FAN", "Node", "lineage"]

#: Levels below the root that are expanded, and links of one list expanded one by one.
DEPTH = 4
FAN = 12


@dataclass
class Node:
    """One object in the tree (``id`` None: a summary of links not shown one by one)."""

    field: str  # the field of the parent that holds the link ("" at the root)
    id: ObjectId | None
    kind: str
    label: str
    note: str = ""
    href: str = ""  # where the node links when not to the object's own page
    children: list[Node] = dataclasses.field(default_factory=list)


def lineage(
    store: Store, root: ObjectId, hidden: Hidden | None, *, depth: int = DEPTH, fan: int = FAN
) -> Node:
    """The tree below ``root``; answers (`Hidden`) are leaves unless ``hidden`` is None."""
    seen: set[bytes] = set()
    return _node(store, "", root, hidden, depth, fan, seen)


def _node(
    store: Store,
    where: str,
    oid: ObjectId,
    hidden: Hidden | None,
    depth: int,
    fan: int,
    seen: set[bytes],
) -> Node:
    try:
        data = store.get_raw(oid)
        kind = encoding.kind_of(data)[0]
    except NotFound:
        return Node(where, oid, "?", "missing", note="not in this store")
    except InvalidObject as e:
        return Node(where, oid, "?", "unreadable", note=str(e))
    if hidden is not None and (why := hidden.reason(oid, kind)):
        return Node(where, oid, kind, kind, note=f"hidden: {why} (--show-answer-keys)")
    if kind in (BLOB, CHUNKED, TREE):
        return Node(where, oid, kind, kind)
    again = oid in seen
    seen.add(oid)
    if kind == JobHead.__kind__:
        return _job(store, where, oid, data, hidden, depth, fan, seen, again)
    try:
        body = plain(encoding.decode(data)[2])
    except InvalidObject as e:
        return Node(where, oid, kind, kind, note=str(e))
    node = Node(where, oid, kind, describe(kind, body))
    if again:
        node.note = "shown above"
        return node
    if depth <= 0:
        return node
    found = list(links(body))
    groups: dict[str, list[tuple[str, ObjectId]]] = {}
    for path, child in found:
        groups.setdefault(path.split("[", 1)[0], []).append((path, child))
    for name, items in groups.items():
        if len(items) > fan:
            node.children.append(
                Node(name, None, "", f"{len(items):,} links", href=f"/object/{oid.hex()}")
            )
            continue
        for path, child in items:
            node.children.append(_node(store, path, child, hidden, depth - 1, fan, seen))
    return node


def _job(
    store: Store,
    where: str,
    oid: ObjectId,
    data: bytes,
    hidden: Hidden | None,
    depth: int,
    fan: int,
    seen: set[bytes],
    again: bool,
) -> Node:
    """A job without decoding its runs: they are one node, linking to the paged list."""
    head = encoding.decode_view(data, JobHead)
    node = Node(where, oid, JobHead.__kind__, f"{JobHead.__kind__} {head.name}", href="")
    if again:
        node.note = "shown above"
        return node
    if depth <= 0:
        return node
    for name in ("task_set", "set_build", "agent_config", "predictions"):
        node.children.append(_node(store, name, getattr(head, name), hidden, depth - 1, fan, seen))
    node.children.append(
        Node("runs", None, "", f"{head.run_count:,} runs", href=f"/job/{oid.hex()}")
    )
    return node
