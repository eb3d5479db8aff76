"""The frequency sketch behind the scope cache's admission (server/context/domain/frequency.py)."""

from __future__ import annotations

import pytest

from satchel.server.context.domain.frequency import CAP, FrequencySketch


def test_a_keys_estimate_counts_its_reads_and_stops_at_the_cap() -> None:
    sketch = FrequencySketch()
    for _ in range(3):
        sketch.add(("events", "p", "a"))
    sketch.add(("events", "p", "b"))
    assert sketch.estimate(("events", "p", "a")) == 3
    assert sketch.estimate(("events", "p", "b")) == 1
    assert sketch.estimate(("facts", "p", "a")) == 0, "another kind of the same scope"
    for _ in range(40):
        sketch.add("hot")
    assert sketch.estimate("hot") == CAP


def test_estimates_never_fall_under_the_reads_among_many_keys() -> None:
    sketch = FrequencySketch(width=64, sample=10**9)  # narrow: collisions happen
    reads = {f"scope-{i}": i % 7 for i in range(200)}
    for key, count in reads.items():
        for _ in range(count):
            sketch.add(key)
    assert all(sketch.estimate(key) >= min(count, CAP) for key, count in reads.items())


def test_after_sample_reads_every_count_is_halved() -> None:
    sketch = FrequencySketch(sample=20)
    for _ in range(12):
        sketch.add("old")
    for _ in range(7):
        sketch.add("new")
    assert (sketch.estimate("old"), sketch.estimate("new")) == (12, 7)
    sketch.add("new")  # the 20th read: halved
    assert (sketch.estimate("old"), sketch.estimate("new")) == (6, 4)


def test_a_sketch_needs_counters() -> None:
    with pytest.raises(ValueError, match="positive"):
        FrequencySketch(width=0)
