"""How often each scope was read lately, in constant memory: TinyLFU's frequency sketch.

Pure, no I/O. A count-min sketch: `depth` rows of `width` counters; reading a key adds one to
one counter per row (each row hashes the key its own way), and a key's estimate is the smallest
of its counters (collisions only ever inflate a counter). Counters stop at `CAP`, and after
`sample` reads every counter is halved, so the estimate follows what is read now rather than
what was read an hour ago (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
Admission Policy", 2017).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

CAP = 15
"""A counter's ceiling (TinyLFU's 4 bits): past it, more reads tell nothing new."""

WIDTH = 8192
"""Counters per row: well above the scopes a server holds, so that collisions stay rare."""

DEPTH = 4
"""Rows, each hashing a key its own way."""


class FrequencySketch:
    """Recent reads per key, estimated (never under-counted until an ageing halves them)."""

    def __init__(self, width: int = WIDTH, depth: int = DEPTH, sample: int | None = None) -> None:
        if width < 1 or depth < 1:
            raise ValueError(f"width and depth must be positive, got {width} and {depth}")
        self.width = width
        self.counters = np.zeros((depth, width), dtype=np.uint8)
        self.sample = sample if sample is not None else 10 * width
        self.reads = 0
        self._rows = np.arange(depth)

    def _slots(self, key: Hashable) -> np.ndarray:
        slots: np.ndarray = np.array([hash((row, key)) % self.width for row in self._rows])
        return slots

    def add(self, key: Hashable) -> None:
        """Count one read of `key`; every `sample` reads, halve every counter."""
        slots = self._slots(key)
        counters = self.counters[self._rows, slots]
        self.counters[self._rows, slots] = np.minimum(counters + 1, CAP)
        self.reads += 1
        if self.reads >= self.sample:
            self.counters >>= 1
            self.reads = 0

    def estimate(self, key: Hashable) -> int:
        """How many recent reads of `key` (at most CAP)."""
        return int(self.counters[self._rows, self._slots(key)].min())
