"""Scoring a chunk as one call per lane (score._dealt): every item's requests go to exactly one call, whole, and the
calls come out about equal in size; with one part the chunk stays one call in its order."""

from __future__ import annotations

from fastscore.records import CandidateSet, EmittedContinuation, Message
from fastscore.study.stages.score import _chars, _dealt


def _request(item: str, n_chars: int) -> CandidateSet:
    return CandidateSet(id=f"{item}::after", messages=(Message("user", "x" * n_chars),), candidates=("a", "bc"))


def test_a_chunk_is_dealt_into_calls_of_about_equal_size_each_item_whole():
    sizes = {"i0": 900, "i1": 100, "i2": 500, "i3": 450, "i4": 60, "i5": 40}
    requests = {i: [_request(i, n), _request(i, n // 2)] for i, n in sizes.items()}
    calls = _dealt(requests, 2)
    assert len(calls) == 2
    assert sorted(i for call in calls for i in call) == sorted(requests)  # each item in exactly one call
    for call in calls:
        for i, reqs in call.items():
            assert reqs is requests[i]  # an item's requests stay together, in their order
    held = [sum(_chars(r) for reqs in call.values() for r in reqs) for call in calls]
    print("call sizes", held)
    assert abs(held[0] - held[1]) <= max(sum(_chars(r) for r in reqs) for reqs in requests.values())
    assert max(held) < 0.6 * sum(held)


def test_one_part_or_one_item_keeps_the_chunk_as_one_call():
    requests = {i: [_request(i, n)] for i, n in (("b", 5), ("a", 50), ("c", 20))}
    assert _dealt(requests, 1) == [requests]
    assert list(_dealt(requests, 1)[0]) == ["b", "a", "c"]
    one = {"a": requests["a"]}
    assert _dealt(one, 2) == [one]
    assert len(_dealt(requests, 8)) == 3  # no call without items


def test_size_counts_messages_tool_calls_and_candidates():
    request = CandidateSet(id="i::after", messages=(Message("user", "abcd"), Message("assistant", None,
                                                                                      tool_calls=({"f": 1},))),
                           candidates=("xy", EmittedContinuation("zzz", (1, 2), True)))
    assert _chars(request) == 4 + len("()") + len(str(({"f": 1},))) + 2 + 3
