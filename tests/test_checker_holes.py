"""The checks that prove exactly once must fail on the cases a sceptic feeds them (issue 20): each test is a
hole the audit (copier.core.audit, behind copier verify, copier audit and the chaos check) once let through."""

from __future__ import annotations

import hashlib

from copier.core.audit import DeadLetter, DuplicateReport, Produced, TargetRecord, audit
from copier.core.audittypes import content_name
from copier.core.config import parse_dedup_key
from copier.core.identity import EventId, extract_event_id, id_digest


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def produced(event_id: str | int, n: int, pk: str = "k", data: bytes | None = None) -> Produced:
    data = data if data is not None else f'{{"eventId": "{event_id}"}}'.encode()
    return Produced(event_id, pk, sha(data), ("shardId-000000000000", 100 + n, 0), size=len(data) + len(pk))


def copy_of(
    p: Produced, seq: int, arrival: int = 1000, data: bytes | None = None, pk: str | None = None
) -> TargetRecord:
    return TargetRecord(
        p.event_id, pk or p.partition_key or "", "t-0", str(seq), sha(data) if data else p.sha256, arrival
    )


def envelope_of(p: Produced, reason: str, arrival: int = 1000, **changes: object) -> DeadLetter:
    fields: dict[str, object] = {
        "reason": reason,
        "position": p.position,
        "partition_key": p.partition_key,
        "sha256": p.sha256,
        "event_id": p.event_id,
        **changes,
    }
    return DeadLetter("dlq-0", "1", arrival, **fields)  # type: ignore[arg-type]


EVENTS = [produced(f"e{i}", i) for i in range(4)]


def clean_target() -> list[TargetRecord]:
    return [copy_of(p, n) for n, p in enumerate(EVENTS)]


def test_a_bare_id_in_the_dead_letter_stream_is_not_a_delivery() -> None:
    """A record that is not an envelope (just {"eventId": "e3"}) delivers nothing: e3 is lost, the record
    invalid."""
    bare = DeadLetter("dlq-0", "9", problem="not a dead-letter envelope (no reason, stream, shardId)", event_id="e3")
    r = audit(EVENTS, clean_target()[:3], [bare])
    assert (r.lost, r.invalid_dead_letters, r.ok) == (1, 1, False)


def test_an_envelope_with_an_invented_reason_or_position_or_bytes_is_invalid() -> None:
    """An envelope must point at a produced record, carry its key and bytes, and give a reason it bears out."""
    e3 = EVENTS[3]
    for bad in (
        envelope_of(e3, "cosmic rays"),
        envelope_of(e3, "no event ID: field eventId is missing"),  # e3 has an ID
        envelope_of(e3, "no event ID: x", position=("shardId-000000000000", 999, 0)),
        envelope_of(e3, "record of 5 bytes exceeds the target's limit of 1048576 bytes"),  # it is not too large
        envelope_of(e3, "no event ID: x", sha256=sha(b"other bytes")),
    ):
        r = audit(EVENTS, clean_target()[:3], [bad])
        assert r.invalid_dead_letters == 1 and r.lost == 1 and not r.ok, bad


def test_a_keyed_event_the_producer_never_meant_for_the_dead_letter_stream_fails_there() -> None:
    """In a run where no rule sends a keyed event to the dead-letter stream (the chaos suite), one there fails."""
    big = produced("big", 9, data=b'{"eventId": "big", "pad": "' + b"p" * 2000 + b'"}')
    reason = f"record of {big.size} bytes exceeds the target's limit of 1000 bytes"
    assert audit([big], [], [envelope_of(big, reason)]).ok
    assert not audit([big], [], [envelope_of(big, reason)], keyed_dead_letters=False).ok


def test_copies_across_both_streams_and_within_the_dead_letter_stream_are_duplicates() -> None:
    """An event in the target and in an envelope, or in two envelopes, is a duplicate."""
    odd = produced("odd", 5, pk="")  # a key Kinesis refuses: dead-lettered
    events = [*EVENTS, odd]
    letter = envelope_of(odd, "partition key is empty")
    assert audit(events, clean_target(), [letter]).ok
    split = audit(events, [*clean_target(), copy_of(odd, 9)], [letter])
    twice = audit(events, clean_target(), [letter, letter])
    for r in (split, twice):
        assert (r.duplicated, r.extra_copies, r.unexplained_copies, r.ok) == (1, 1, 1, False)


def test_one_report_excuses_one_extra_copy_per_id_it_names_in_its_window() -> None:
    """A possible_duplicates report naming e0 and e1 excuses one extra copy of each arriving after its window
    opens: a third copy of e0, or a copy of e2, or one before the window, is not excused."""
    report = DuplicateReport(("e0", "e1"), from_ms=500)
    excused = clean_target() + [copy_of(EVENTS[0], 10, 900), copy_of(EVENTS[1], 11, 900)]
    r = audit(EVENTS, excused, reports=[report])
    assert (r.explained_copies, r.unexplained_copies, r.reports, r.reported_ids, r.ok) == (2, 0, 1, 2, True)
    for extra in (copy_of(EVENTS[0], 12, 950), copy_of(EVENTS[2], 13, 950)):
        assert not audit(EVENTS, [*excused, extra], reports=[report]).ok
    early = clean_target() + [copy_of(EVENTS[0], 10, 400)]
    early[0] = copy_of(EVENTS[0], 0, 300)
    assert audit(EVENTS, early, reports=[report]).unexplained_copies == 1


def test_a_copy_whose_bytes_or_key_changed_is_not_a_delivery() -> None:
    """A target record cut down to {"eventId": ...}, or under another partition key, is changed: fails."""
    cut = clean_target()
    cut[0] = copy_of(EVENTS[0], 0, data=b'{"eventId": "e0"}x')
    rekeyed = clean_target()
    rekeyed[1] = copy_of(EVENTS[1], 1, pk="other")
    for target in (cut, rekeyed):
        r = audit(EVENTS, target)
        assert (r.changed, r.ok) == (1, False)


def test_order_is_judged_on_the_produced_keys_not_the_targets() -> None:
    """Two events of one produced key swapped in the target, with their keys rewritten there: out of order."""
    a, b = produced("a", 0, pk="K"), produced("b", 1, pk="K")
    target = [copy_of(b, 0, pk="x"), copy_of(a, 1, pk="y")]
    r = audit([a, b], target)
    assert r.out_of_order == 1


def test_an_event_without_an_id_missing_from_both_streams_is_lost() -> None:
    """One produced without an ID and in neither stream fails; in the dead-letter stream it is delivered."""
    data = b"heartbeat"
    hb = Produced(None, "hb", sha(data), ("shardId-000000000000", 7, 0))
    missing = audit([*EVENTS, hb], clean_target())
    assert (missing.unkeyed_expected, missing.unkeyed_lost, missing.ok) == (1, 1, False)
    in_dlq = audit([*EVENTS, hb], clean_target(), [envelope_of(hb, "no event ID: payload is not JSON")])
    assert (in_dlq.unkeyed_lost, in_dlq.ok) == (0, True)


def test_an_event_without_an_id_three_times_in_the_target_fails_unless_reports_name_it() -> None:
    """Produced once, three copies: two extra copies no report explains fail the audit (before: counted, and
    OK). Reports that name it by its content digest (each name one copy, within its window) explain them; a
    report naming another record, or one whose window closed before a copy arrived, does not."""
    data = b"heartbeat"
    hb = Produced(None, "hb", sha(data), ("shardId-000000000000", 7, 0))
    name = content_name("hb", data)
    thrice = clean_target() + [
        TargetRecord(None, "hb", "t-0", str(20 + n), sha(data), 100 * n, content=name) for n in range(3)
    ]
    bare = audit([*EVENTS, hb], thrice)
    assert (bare.unkeyed_lost, bare.unkeyed_extra_copies, bare.unkeyed_unexplained, bare.ok) == (0, 2, 2, False)
    assert bare.unkeyed_unexplained_examples == ("t-0@21 (partition key hb)", "t-0@22 (partition key hb)")
    once = DuplicateReport((), 0, None, unkeyed=(name,))
    named = audit([*EVENTS, hb], thrice, reports=[once, DuplicateReport((), 50, None, unkeyed=(name,))])
    assert (named.unkeyed_explained, named.unkeyed_unexplained, named.reported_unkeyed, named.ok) == (2, 0, 2, True)
    twice_in_one = audit([*EVENTS, hb], thrice, reports=[DuplicateReport((), 0, None, unkeyed=(name, name))])
    assert twice_in_one.ok, "two identical records sent again are named twice"
    short = [once, DuplicateReport((), 0, 150, unkeyed=(name,))]  # its window closed before the third copy
    other = [once, DuplicateReport((), 0, None, unkeyed=(content_name("hb", b"other"),))]
    for reports in ([once], short, other):
        r = audit([*EVENTS, hb], thrice, reports=reports)
        assert (r.unkeyed_explained, r.unkeyed_unexplained, r.ok) == (1, 1, False), reports
    assert r.unkeyed_unexplained_examples == ("t-0@22 (partition key hb)",), "the latest copy is the extra one"


def test_a_record_without_an_id_put_to_the_target_then_dead_lettered_is_named_by_either_form() -> None:
    """A chunk in flight forwarded it (unkeyedPolicy forward); its successor, configured to dead-letter such
    records, sent it again as an envelope. The envelope delivers it; the target copy is the extra one, and a
    report naming it in either form (its target copy, or its envelope) explains it. A copy of a record never
    produced is unexpected, not a failure."""
    data = b"heartbeat"
    hb = Produced(None, "hb", sha(data), ("shardId-000000000000", 7, 0))
    letter = envelope_of(hb, "no event ID: payload is not JSON", arrival=500, content="e" * 20)
    target = [*clean_target(), TargetRecord(None, "hb", "t-0", "30", sha(data), 100, content=content_name("hb", data))]
    bare = audit([*EVENTS, hb], target, [letter])
    assert (bare.unkeyed_lost, bare.unkeyed_extra_copies, bare.unkeyed_unexplained, bare.ok) == (0, 1, 1, False)
    for name in (content_name("hb", data), "e" * 20):
        assert audit([*EVENTS, hb], target, [letter], [DuplicateReport((), 0, None, unkeyed=(name,))]).ok, name
    stray = [*clean_target(), TargetRecord(None, "x", "t-0", "31", sha(b"never"), content=content_name("x", b"never"))]
    r = audit([*EVENTS, hb], stray, [letter])
    assert (r.unkeyed_unexpected, r.unkeyed_unexplained, r.ok) == (1, 0, True)


def test_an_integer_id_and_the_same_digits_as_a_string_are_two_events() -> None:
    """{"eventId": 1} and {"eventId": "1"} are different JSON values: two IDs for the copier and the audit."""
    key = parse_dedup_key("json:eventId")
    number, text = extract_event_id(key, "k", b'{"eventId": 1}'), extract_event_id(key, "k", b'{"eventId": "1"}')
    assert number == EventId(1) and text == EventId("1")
    assert id_digest(1) != id_digest("1")
    one, one_text = produced(1, 0), produced("1", 1)
    r = audit([one, one_text], [copy_of(one, 0)])
    assert (r.lost, r.lost_examples) == (1, ("1",))
