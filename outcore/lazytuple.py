"""A read-only sequence that large results (a schedule's actions, a simulation's events) are
held as: columns first, the tuple of items made from them on first read (no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable


class LazyTuple(Sequence):
    """``length`` items that ``make()`` returns as a tuple the first time one is read; equal
    to that tuple (and to any sequence of the same items), and pickled (deep-copied) as it.
    Subclasses keep the columns the items are made from, which their users read instead."""

    noun = "items"  # what the items are, for repr

    def __init__(self, length: int, make: Callable[[], tuple]) -> None:
        self._length = length
        self._make: Callable[[], tuple] | None = make
        self._items: tuple = ()

    def _all(self) -> tuple:
        if self._make is not None:
            self._items, self._make = self._make(), None
        return self._items

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: Any):
        return self._all()[i]

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and \
            tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other):
        return self._all() + tuple(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} {self.noun})"

    def __reduce__(self):
        return tuple, (self._all(),)
