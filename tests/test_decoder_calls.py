"""The decoder-call tally of bench/lab/decoder_calls.py: crafted calls, counted by hand."""

from __future__ import annotations

from fastscore.bench.lab.decoder_calls import call_kind, tally


def test_calls_are_tallied_per_environment_and_kind():
    calls = [
        {"env": "tools", "kind": call_kind(0, 3), "tokens": [3, 1, 2], "seconds": 1.5},
        {"env": "tools", "kind": call_kind(0, 1), "tokens": [4], "seconds": 0.5},
        {"env": "tools", "kind": call_kind(2, 0), "tokens": [10, 20], "seconds": 2.0},
        {"env": "mbpp-7", "kind": call_kind(0, 0), "tokens": [], "seconds": 0.25},
        {"env": "mbpp-7", "kind": call_kind(1, 2), "tokens": [5, 6, 7], "seconds": 3.0},
    ]
    assert tally(calls) == {
        "mbpp-7, greedy": {"calls": 1, "requests": 0, "tokens": 0, "lane_seconds": 0.25},
        "mbpp-7, greedy and sampled": {"calls": 1, "requests": 3, "tokens": 18, "lane_seconds": 3.0},
        "tools, greedy": {"calls": 1, "requests": 2, "tokens": 30, "lane_seconds": 2.0},
        "tools, sampled": {"calls": 2, "requests": 4, "tokens": 10, "lane_seconds": 2.0},
    }
