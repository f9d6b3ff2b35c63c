"""One item's ScoreRows: its stored candidate-set scores and its greedy completions, judged by its environment."""

from __future__ import annotations

from typing import Any

from fastscore.records import GreedyResult
from fastscore.study.conditions import CONDITIONS, banned_candidate_lp
from fastscore.study.envs.base import StudyEnv
from fastscore.study.items import Item
from fastscore.study.metrics import ScoreRow, candidate_probabilities


def score_rows(item: Item, lp_record: dict[str, Any], greedy: dict[str, GreedyResult], env: StudyEnv
               ) -> list[ScoreRow]:
    rows = []
    for cond in CONDITIONS:
        scored, decoded = lp_record["conditions"][cond], greedy[cond]
        cand_lp, n = scored["cand_lp"], scored["cand_n_tokens"]
        if cond == "ban":
            cand_lp = banned_candidate_lp(cand_lp)
            p, p_norm = candidate_probabilities(cand_lp, n)
        else:
            p, p_norm = scored["p"][0], scored["p_norm"][0]
        rows.append(ScoreRow(
            item_id=item.item_id, env=item.env, condition=cond, lp=cand_lp[0], n_tokens=n[0], cand_lp=cand_lp,
            cand_n_tokens=n, p_repeat=p, p_repeat_norm=p_norm, greedy=decoded.text,
            greedy_repeat=env.same_action(decoded.text, item.failed_action),
            greedy_success=env.evaluate(item.source_id, decoded.text).ok,
            banned_mass=decoded.banned_mass if cond == "ban" else None,
        ))
    return rows
