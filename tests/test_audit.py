"""The exactly-once audit (copier.core.audit): lost, duplicated, unexpected, unkeyed, dead-lettered, out of order."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from hypothesis import assume, given
from hypothesis import strategies as st

from copier.core.audit import DeadLetter, OutOfOrder, TargetRecord, Unkeyed, audit, production_index

KEYS = "abcd"


@dataclass(frozen=True)
class Scenario:
    """Distinct event IDs in production order, the production (with producer retries), and a clean target."""

    ids: list[str]
    produced: list[str]
    key_of: dict[str, str]
    target: list[TargetRecord]


def record(event_id: str, key_of: dict[str, str]) -> TargetRecord:
    key = key_of[event_id]
    return TargetRecord(event_id, key, f"shard-{KEYS.index(key) % 2}")


@st.composite
def scenarios(draw: st.DrawFn, min_size: int = 0) -> Scenario:
    """A clean copy: the target is an interleaving of the distinct IDs that keeps each key's order."""
    n = draw(st.integers(min_size, 40))
    ids = [f"e{i}" for i in range(n)]
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=n, max_size=n))
    key_of = dict(zip(ids, keys, strict=True))
    queues = {k: deque(i for i in ids if key_of[i] == k) for k in KEYS}
    target_ids = [queues[k].popleft() for k in draw(st.permutations(keys))]
    produced = list(ids)
    for _ in range(draw(st.integers(0, 5)) if n else 0):  # producer retries: an ID written again, later
        event_id = ids[draw(st.integers(0, n - 1))]
        produced.insert(draw(st.integers(produced.index(event_id) + 1, len(produced))), event_id)
    return Scenario(ids, produced, key_of, [record(i, key_of) for i in target_ids])


@given(scenarios())
def test_a_clean_copy_reports_nothing_wrong(s: Scenario) -> None:
    """A target holding each produced ID once, in per-key production order, gives all zeros and ok."""
    r = audit(s.produced, s.target)
    assert (r.expected, r.produced, r.found) == (len(s.ids), len(s.produced), len(s.ids))
    counts = (r.lost, r.duplicated, r.extra_copies, r.unexpected, r.unkeyed, r.dead_lettered, r.out_of_order)
    assert counts == (0,) * 7
    assert r.ok


@given(scenarios(), st.data())
def test_removed_records_are_counted_as_lost(s: Scenario, data: st.DataObject) -> None:
    """Removing k records from a clean target gives lost == k, with removed IDs as examples."""
    removed = set(data.draw(st.sets(st.sampled_from(s.ids), max_size=len(s.ids)) if s.ids else st.just(set[str]())))
    r = audit(s.produced, [t for t in s.target if t.event_id not in removed], examples=3)
    assert r.lost == len(removed)
    assert set(r.lost_examples) <= removed and len(r.lost_examples) == min(3, len(removed))
    assert r.out_of_order == 0 and r.duplicated == 0
    assert r.ok == (not removed)


@given(scenarios(min_size=1), st.data())
def test_copies_are_counted_as_duplicated(s: Scenario, data: st.DataObject) -> None:
    """Inserting extra copies counts each copied ID once and every surplus record as an extra copy."""
    copies = data.draw(st.lists(st.sampled_from(s.ids), min_size=1, max_size=10))
    target = list(s.target)
    for event_id in copies:
        target.insert(data.draw(st.integers(0, len(target))), record(event_id, s.key_of))
    r = audit(s.produced, target)
    assert r.duplicated == len(set(copies))
    assert r.extra_copies == len(copies)
    assert r.found == len(s.ids) + len(copies)
    assert {i for i, _ in r.duplicated_examples} <= set(copies)
    assert all(n >= 2 for _, n in r.duplicated_examples)
    assert r.lost == 0 and not r.ok


@given(scenarios(min_size=2), st.data())
def test_swapping_two_records_of_one_key_is_out_of_order(s: Scenario, data: st.DataObject) -> None:
    """Exchanging two same-key records of a clean target is detected as out of order, and nothing else."""
    key = data.draw(st.sampled_from(KEYS))
    positions = [n for n, t in enumerate(s.target) if t.partition_key == key]
    assume(len(positions) >= 2)
    first, second = sorted(data.draw(st.lists(st.sampled_from(positions), min_size=2, max_size=2, unique=True)))
    target = list(s.target)
    target[first], target[second] = target[second], target[first]
    r = audit(s.produced, target)
    assert r.out_of_order >= 1
    assert r.out_of_order_examples[0].partition_key == key
    assert r.ok and r.lost == 0 and r.duplicated == 0


@given(scenarios(min_size=1), st.data())
def test_ids_in_valid_dead_letter_envelopes_count_as_delivered(s: Scenario, data: st.DataObject) -> None:
    """An ID missing from the target but carried by a valid dead-letter envelope is delivered there, not lost."""
    moved = data.draw(st.sets(st.sampled_from(s.ids), min_size=1))
    letters = [DeadLetter("dlq-0", str(n), reason="no event ID: x", event_id=i) for n, i in enumerate(sorted(moved))]
    r = audit(s.produced, [t for t in s.target if t.event_id not in moved], letters)
    assert r.lost == 0 and r.ok
    assert r.dead_lettered == len(moved) and r.dead_letter_records == len(moved)


@given(scenarios(), st.lists(st.text(min_size=1, max_size=3), max_size=5), st.integers(0, 5))
def test_unexpected_and_unkeyed_records_are_counted(s: Scenario, strangers: list[str], unkeyed: int) -> None:
    """IDs never produced are unexpected, records without an ID are unkeyed; neither fails the audit."""
    strangers = [f"x-{t}" for t in strangers]
    extra = [TargetRecord(i, "z", "shard-9") for i in strangers]
    extra += [TargetRecord(None, "z", "shard-9", str(n)) for n in range(unkeyed)]
    r = audit(s.produced, s.target + extra)
    assert r.unexpected == len(set(strangers))
    assert r.unkeyed == unkeyed
    assert r.duplicated == len({i for i in strangers if strangers.count(i) > 1})


@given(scenarios(), st.integers(0, 3))
def test_examples_are_bounded(s: Scenario, limit: int) -> None:
    """No category lists more than the requested number of examples."""
    r = audit(s.produced, list(reversed(s.target)) * 2 + [TargetRecord(None, "k", "s")] * 5, examples=limit)
    for examples in (r.lost_examples, r.duplicated_examples, r.unkeyed_examples, r.out_of_order_examples):
        assert len(examples) <= limit


def test_production_index_is_the_first_occurrence() -> None:
    """A producer retry does not move an event's place in production order."""
    index, occurrences = production_index(["a", "b", "a", "c", "b"])
    assert index == {"a": 0, "b": 1, "c": 2} and occurrences == 5


def test_out_of_order_counts_every_record_behind_the_latest_produced() -> None:
    """Each record produced before the latest-produced earlier record of its key counts once."""
    target = [TargetRecord(i, "k", "s") for i in ("c", "a", "b", "d")] + [TargetRecord("a", "other", "s")]
    r = audit(["a", "b", "c", "d"], target)
    assert r.out_of_order == 2
    assert r.out_of_order_examples == (OutOfOrder("a", "k", "c"), OutOfOrder("b", "k", "c"))


def test_a_late_duplicate_is_a_duplicate_and_order_is_judged_on_first_copies() -> None:
    """A copy arriving after later events of its key is a duplicate (judged as one); the order of first copies
    is kept, so it is not counted again as out of order. A first copy after a later event is."""
    r = audit(["a", "b"], [TargetRecord("a", "k", "s"), TargetRecord("b", "k", "s"), TargetRecord("a", "k", "s")])
    assert (r.duplicated, r.extra_copies, r.out_of_order) == (1, 1, 0)
    swapped = audit(["a", "b"], [TargetRecord("b", "k", "s"), TargetRecord("a", "k", "s")])
    assert swapped.out_of_order == 1
    assert r.duplicated_examples == (("a", 2),)


def test_unkeyed_examples_say_where_the_record_is() -> None:
    """An unkeyed record is shown by shard, sequence number and partition key."""
    r = audit([], [TargetRecord(None, "pk", "shard-1", "42")])
    assert r.unkeyed_examples == (Unkeyed("shard-1", "42", "pk"),)
    assert r.ok


def test_report_as_json_holds_every_count_and_example() -> None:
    """to_json gives a JSON-serialisable dict with the verdict, counts and examples."""
    r = audit(["a", "b", "c"], [TargetRecord("a", "k", "s"), TargetRecord("a", "k", "s"), TargetRecord("z", "k", "s")])
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["ok"] is False
    assert (doc["lost"], doc["duplicated"], doc["unexpected"]) == (2, 1, 1)
    assert doc["examples"]["lost"] == ["b", "c"]
    assert doc["examples"]["duplicated"] == [{"event_id": "a", "copies": 2}]
