"""Token caps from the data (fastscore.study.data.caps) and the reference answers the environments give it."""

from __future__ import annotations

import pytest

from fastscore.errors import DataError
from fastscore.study.data.caps import cut_share, data_cap
from fastscore.study.data.envs.mbpp.env import MbppEnv, format_program
from fastscore.study.data.envs.tools.env import ToolsEnv


def test_cap_is_the_percentile_plus_a_margin():
    lengths = list(range(1, 101))  # p99 of 1..100 (linear interpolation) = 99.01 -> 100
    assert data_cap(lengths) == 100 + 25
    assert data_cap([10] * 50) == 10 + 8  # the minimum margin
    assert cut_share(lengths, 90) == pytest.approx(0.10)
    assert cut_share(lengths, data_cap(lengths)) == 0.0
    with pytest.raises(DataError):
        data_cap([])


def test_environments_give_their_reference_answers_in_the_scored_form(study_data):
    mbpp = MbppEnv(study_data)
    refs = mbpp.reference_actions()
    first = next(iter(mbpp.sources().values()))
    assert refs[0] == format_program(first.code) and len(refs) == len(mbpp.sources())
    calls = ToolsEnv(study_data).reference_actions()
    assert calls and all(c.endswith(")") for c in calls)


def test_the_environments_caps_are_the_ones_their_data_gives(study_data, smollm_tokenizer):
    for env in (ToolsEnv(study_data), MbppEnv(study_data)):
        lengths = [len(smollm_tokenizer.encode(text).ids) for text in env.reference_actions()]
        derived = data_cap(lengths)
        print(f"{env.name}: {len(lengths)} references, derived cap {derived}, constant {env.max_new_tokens}")
        assert env.max_new_tokens == derived
