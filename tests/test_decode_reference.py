"""bench/lab/decode_reference.py: a step's reference, its arithmetic at the sgemm rate plus its KV cells read once."""

import pytest

from fastscore.bench.lab.decode_reference import step_reference


def test_a_steps_reference_adds_its_rows_arithmetic_to_reading_its_cells():
    # 4 rows of 1e9 FLOP at 1e11 FLOP/s: 0.04 s; 100 cells of 1e6 bytes of K (and of V) at 1e9 and 5e8 B/s: 0.3 s
    assert step_reference(4, 100, 1e9, 1e11, 1e6, 1e9, 5e8) == pytest.approx(0.04 + 0.1 + 0.2)
    # the read grows with the cells, the arithmetic with the rows
    assert step_reference(4, 200, 1e9, 1e11, 1e6, 1e9, 5e8) - step_reference(4, 100, 1e9, 1e11, 1e6, 1e9, 5e8) == (
        pytest.approx(0.3))
    assert step_reference(8, 0, 1e9, 1e11, 1e6, 1e9, 5e8) == pytest.approx(0.08)


def test_a_calls_seconds_split_into_prefill_joins_and_plain_steps():
    from fastscore.bench.lab.decode_reference import time_split

    calls = [{"env": "mbpp", "kind": "greedy and sampled", "call_seconds": 10.0, "start_seconds": 2.0,
              "step_joins": [0, 1, 0], "step_seconds": [1.0, 3.0, 1.5]},
             {"env": "mbpp", "kind": "greedy and sampled", "call_seconds": 5.0, "start_seconds": 1.0,
              "step_joins": [0], "step_seconds": [2.0]},
             {"env": "tools", "kind": "greedy", "call_seconds": 1.0, "start_seconds": 0.5,
              "step_joins": [], "step_seconds": []}]
    assert time_split(calls) == {("mbpp", "greedy and sampled"): (15.0, 3.0, 3.0, 4.5),
                                 ("tools", "greedy"): (1.0, 0.5, 0.0, 0.0)}
