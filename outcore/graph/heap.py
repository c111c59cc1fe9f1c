"""Binary min-heaps of ``(float key, int item)`` pairs in preallocated arrays, for compiled
kernels (numba's ``heapq`` wants lists; a kernel with one heap per device keeps them as slices
of one array). Ties on the key break on the item, so every pop order is deterministic."""

from __future__ import annotations

from outcore.graph.jit import njit_borrowing as njit

__all__ = ["heap_pop", "heap_push"]


@njit
def heap_push(keys, items, size, key, item, base=0):
    """Push (key, item) on a binary min-heap ordered by (key, item) held from ``base`` on in
    ``keys`` and ``items`` (a region of arrays that hold several heaps: no slice per call);
    return the new size."""
    i = size
    while i > 0:
        p = (i - 1) >> 1
        pk = keys[base + p]
        if pk < key or (pk == key and items[base + p] < item):
            break
        keys[base + i] = pk
        items[base + i] = items[base + p]
        i = p
    keys[base + i] = key
    items[base + i] = item
    return size + 1


@njit
def heap_pop(keys, items, size, base=0):
    """Remove the top of the heap held from ``base`` on (the caller reads ``keys[base]``,
    ``items[base]`` first); return the new size."""
    size -= 1
    if size == 0:
        return 0
    key = keys[base + size]
    item = items[base + size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        r = c + 1
        if r < size and (keys[base + r] < keys[base + c]
                         or (keys[base + r] == keys[base + c]
                             and items[base + r] < items[base + c])):
            c = r
        if keys[base + c] < key or (keys[base + c] == key and items[base + c] < item):
            keys[base + i] = keys[base + c]
            items[base + i] = items[base + c]
            i = c
        else:
            break
    keys[base + i] = key
    items[base + i] = item
    return size
