"""`TASKSETS_GROW`: the update policy of ``tasksets/<benchmark>/<set>``, "a task set only grows".

Registered for the prefix ``tasksets/`` by the package's entry point (group
``medomni.ref_policies``), so that every path that moves such a ref runs it: ``Refs``,
``cas ref set/delete``, bundle import, push, pull and clone. It covers the set refs only:
``studio/sets/`` (the latest build, which moves with X rises) and ``published/`` (what a
bundle holds) have no such rule.

The rule, decided by decoding both records with the studio's typed decoder (fields the
record class does not know are ignored, so an extra field that links the old value counts
for nothing; reachability is never asked):

* a ref whose value is a task set record is not deleted;
* its new value is a task set record named as the ref, with the same builder, every arm of
  the old and every pair of the old at the same N (`check_grows`);
* a ref created where one was deleted (by force) grows the last task set its history
  names, while that record is still stored.

A ref whose value is not a task set record (some other object under the name) is not a task
set, and nothing is asked of it until it points at one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medomni_cas.errors import InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.policies import RefPolicy
from medomni_cas.studio.records import TaskSetRecord
from medomni_cas.studio.refnames import TASK_SET_REFS
from medomni_cas.studio.tasksets import TaskSetError, check_grows

if TYPE_CHECKING:
    from medomni_cas.store.store import Store

__all__ = ["TASKSETS_GROW", "TaskSetsGrow"]

_KIND = TaskSetRecord.__kind__


class TaskSetsGrow(RefPolicy):
    """A task set ref only grows (see the module docstring)."""

    def check(self, store: Store, name: str, old: ObjectId | None, new: ObjectId | None) -> None:
        if not name.startswith(TASK_SET_REFS):
            return
        before = old if old is not None else _last_value(store, name)
        prior = None if before is None else self._task_set(store, name, before, old, new)
        prior_id = "" if before is None else before.hex()
        if new is None:
            if prior is not None:
                raise self.refuse(
                    name, old, new, f"it holds task set {prior.name}, and a task set only grows"
                )
            return
        if prior is None:
            return
        rec = self._read(store, name, new, old, new, "new")
        if rec is None:
            raise self.refuse(
                name, old, new, f"the new value is not a task set record, and {name} holds one"
            )
        set_name = name.removeprefix(TASK_SET_REFS)
        if rec.name != set_name:
            raise self.refuse(
                name, old, new, f"the new record is task set {rec.name!r}, not {set_name!r}"
            )
        try:
            check_grows(prior, rec)
        except TaskSetError as e:
            was = "" if old is not None else f" (it was {prior_id} before it was deleted)"
            raise self.refuse(name, old, new, f"{e}{was}") from None

    def _task_set(
        self,
        store: Store,
        name: str,
        oid: ObjectId,
        old: ObjectId | None,
        new: ObjectId | None,
    ) -> TaskSetRecord | None:
        """The task set the ref held: None when ``oid`` is not one (or, for a value only
        the history names, no longer stored)."""
        if old is None:  # from the history: gone after gc is no longer a set to protect
            try:
                store.get_raw(oid)
            except NotFound:
                return None
        return self._read(store, name, oid, old, new, "old")

    def _read(
        self,
        store: Store,
        name: str,
        oid: ObjectId,
        old: ObjectId | None,
        new: ObjectId | None,
        which: str,
    ) -> TaskSetRecord | None:
        """``oid`` decoded as a task set record; None when it is another kind of object;
        refused when it claims to be one and does not decode."""
        try:
            data = store.get_raw(oid)
        except NotFound:
            raise self.refuse(name, old, new, f"the {which} value is not stored") from None
        try:
            kind, _ = encoding.kind_of(data)
        except InvalidObject:
            return None  # a blob or a tree: not a task set
        if kind != _KIND:
            return None
        try:
            return encoding.decode_body(data, TaskSetRecord)
        except InvalidObject as e:
            raise self.refuse(
                name, old, new, f"the {which} value does not decode as a task set: {e}"
            ) from None


def _last_value(store: Store, name: str) -> ObjectId | None:
    """The last value the ref's history set (a ref created again after a delete)."""
    for entry in reversed(store.refs.history(name)):
        if entry.new is not None:
            return ObjectId(entry.new)
    return None


#: The instance the entry point names.
TASKSETS_GROW = TaskSetsGrow()
