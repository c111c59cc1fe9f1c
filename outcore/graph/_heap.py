"""Binary min-heaps of ``(float key, int item)`` pairs in preallocated arrays, for compiled
kernels (numba's ``heapq`` wants lists; a kernel with one heap per device keeps them as slices
of one array). Ties on the key break on the item, so every pop order is deterministic."""

from __future__ import annotations

from outcore.graph._jit import njit_borrowing as njit

__all__ = ["heap_pop", "heap_push"]


@njit
def heap_push(keys, items, size, key, item):
    """Push (key, item) on a binary min-heap ordered by (key, item); return the new size."""
    i = size
    while i > 0:
        p = (i - 1) >> 1
        pk = keys[p]
        if pk < key or (pk == key and items[p] < item):
            break
        keys[i] = pk
        items[i] = items[p]
        i = p
    keys[i] = key
    items[i] = item
    return size + 1


@njit
def heap_pop(keys, items, size):
    """Remove the top of the heap (caller reads ``keys[0], items[0]`` first); return new size."""
    size -= 1
    if size == 0:
        return 0
    key = keys[size]
    item = items[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        r = c + 1
        if r < size and (keys[r] < keys[c] or (keys[r] == keys[c] and items[r] < items[c])):
            c = r
        if keys[c] < key or (keys[c] == key and items[c] < item):
            keys[i] = keys[c]
            items[i] = items[c]
            i = c
        else:
            break
    keys[i] = key
    items[i] = item
    return size
