"""Children before parents: the heights of a set of objects, the order writers store them in.

An object's height is 0 when it links nothing in the set, else one more than the highest
object it links there. Writing the set height by height, each height in batches of its
own, puts every object in a later batch than everything it links: a writer that dies (or
finds the disk full) after any batch leaves only objects whose links are stored, which is
what "presence implies closure" asks of every writer (`medomni_cas.store.bundle`,
`medomni_cas.store.Store.put_raw_many`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["levels"]


def levels(kids: Sequence[Sequence[int]]) -> list[list[int]]:
    """The nodes ``0 … len(kids)-1`` grouped by height, lowest first (each group in node
    order); ``kids[i]`` are the nodes node ``i`` links. Links form no cycle (ids are hashes
    of what links them), but a cycle is refused with `ValueError` rather than looped on."""
    n = len(kids)
    height = [-1] * n
    # every node is pushed at most once per link to it (and once as a start), and seen on
    # top of the stack at most twice per push: more steps than that means a cycle
    budget = 2 * (n + sum(map(len, kids))) + 1
    for start in range(n):
        if height[start] >= 0:
            continue
        stack = [start]
        while stack:
            budget -= 1
            if budget < 0:
                raise ValueError("objects link each other in a cycle")
            i = stack[-1]
            if height[i] >= 0:  # pushed twice, done the first time
                stack.pop()
                continue
            todo = [c for c in kids[i] if height[c] < 0]
            if todo:
                stack.extend(todo)
                continue
            height[i] = 1 + max((height[c] for c in kids[i]), default=-1)
            stack.pop()
    out: list[list[int]] = [[] for _ in range(max(height, default=-1) + 1)]
    for i, h in enumerate(height):
        out[h].append(i)
    return out
