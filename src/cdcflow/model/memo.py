"""Values worked out once per object, found by the object's identity.

The hot paths of capture meet the same few objects again and again (one relation's column
types, one transaction's source block). `functools.lru_cache` would hash such an object,
field by field, on every call; an `IdentityMemo` looks it up by `id()` and keeps the object
alive beside its value, so an id is never mistaken for a later object's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """`compute(key)`, once per key object while it is remembered (at most `size` keys)."""

    def __init__(self, compute: Callable[[K], V], size: int = 1024) -> None:
        self.compute = compute
        self.size = size
        self.found: dict[int, tuple[K, V]] = {}

    def __call__(self, key: K) -> V:
        found = self.found.get(id(key))
        if found is not None and found[0] is key:
            return found[1]
        value = self.compute(key)
        if len(self.found) >= self.size:
            self.found.clear()
        self.found[id(key)] = (key, value)
        return value
