"""An in-process backend: dicts under a lock. For tests and scratch work."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from medomni_cas.store.backend import Backend, Entry

__all__ = ["MemoryBackend"]


class MemoryBackend(Backend):
    """Objects and refs in dicts of this process, gone when it ends (``memory://``)."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._objects: dict[bytes, tuple[float, bytes]] = {}
        self._refs: dict[str, bytes] = {}
        self._logs: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        # docstring inherited
        return cls(url)

    def get(self, key: bytes) -> bytes:
        # docstring inherited
        return self._objects[key][1]

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        # docstring inherited
        now = time.time()
        new = 0
        with self._lock:
            for key, data in items:
                if key not in self._objects:
                    new += 1
                # refresh the stamp either way: gc's grace period counts from the last put
                self._objects[bytes(key)] = (now, bytes(data))
        return new

    def contains(self, key: bytes) -> bool:
        # docstring inherited
        return key in self._objects

    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        # docstring inherited
        for key in list(self._objects):
            if key.hex().startswith(hex_prefix):
                yield key

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        # docstring inherited
        for key, (stamp, _) in list(self._objects.items()):
            yield key, stamp

    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        # docstring inherited
        n = 0
        with self._lock:
            for key in keys:
                entry = self._objects.get(key)
                if entry is not None and (older_than is None or entry[0] < older_than):
                    del self._objects[key]
                    n += 1
        return n

    def ref_get(self, name: str) -> bytes | None:
        # docstring inherited
        return self._refs.get(name)

    def ref_get_many(self, names: Sequence[str]) -> list[bytes | None]:
        # docstring inherited
        return list(map(self._refs.get, names))

    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        # docstring inherited
        with self._lock:
            if self._refs.get(name) != old:
                return False
            log = self._logs.setdefault(name, [])
            data = entry if isinstance(entry, bytes) else entry(log[-1] if log else None)
            if new is None:
                self._refs.pop(name, None)
            else:
                self._refs[name] = bytes(new)
            log.append(data)
            return True

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        # docstring inherited
        for name in sorted(self._refs):
            if name.startswith(prefix):
                yield name, self._refs[name]

    def ref_log(self, name: str) -> list[bytes]:
        # docstring inherited
        return list(self._logs.get(name, ()))

    def ref_log_names(self) -> Iterator[str]:
        # docstring inherited
        return iter(sorted(self._logs))
