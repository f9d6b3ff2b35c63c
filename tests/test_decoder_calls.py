"""The decoder-call tally of bench/lab/decoder_calls.py: crafted calls, counted by hand."""

from __future__ import annotations

from fastscore.bench.lab.decoder_calls import tally


def test_calls_are_tallied_per_environment_and_kind():
    calls = [
        {"env": "tools", "sampled": True, "tokens": [3, 1, 2], "seconds": 1.5},
        {"env": "tools", "sampled": True, "tokens": [4], "seconds": 0.5},
        {"env": "tools", "sampled": False, "tokens": [10, 20], "seconds": 2.0},
        {"env": "mbpp-7", "sampled": False, "tokens": [], "seconds": 0.25},
    ]
    assert tally(calls) == {
        "mbpp-7, greedy": {"calls": 1, "requests": 0, "tokens": 0, "lane_seconds": 0.25},
        "tools, greedy": {"calls": 1, "requests": 2, "tokens": 30, "lane_seconds": 2.0},
        "tools, sampled": {"calls": 2, "requests": 4, "tokens": 10, "lane_seconds": 2.0},
    }
