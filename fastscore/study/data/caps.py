"""Token caps from the data: the 99th percentile of the reference answers' token lengths plus a margin.

A cap below what a correct answer needs cuts attempts for their length, not their content; a cap far above it lets a
small model's rambling decide which attempts survive. `python -m fastscore.study.data.caps [DATA_DIR]` prints each
environment's derived cap next to the constant the study uses (StudyEnv.max_new_tokens) and the share of reference
answers each would cut, with the embedded model's tokenizer.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from fastscore.errors import DataError

QUANTILE = 0.99
MARGIN_SHARE = 0.25  # the margin: a quarter of the percentile ...
MIN_MARGIN = 8  # ... and at least this many tokens


def data_cap(lengths, quantile: float = QUANTILE, margin_share: float = MARGIN_SHARE,
             min_margin: int = MIN_MARGIN) -> int:
    """ceil(the `quantile` of the token lengths) + max(min_margin, ceil(margin_share x that percentile))."""
    n = np.asarray(list(lengths), dtype=float)
    if n.size == 0:
        raise DataError("no reference answer to derive a token cap from")
    top = math.ceil(float(np.quantile(n, quantile)))
    return top + max(min_margin, math.ceil(margin_share * top))


def cut_share(lengths, cap: int) -> float:
    """The share of answers longer than `cap` tokens (they would be cut)."""
    n = np.asarray(list(lengths), dtype=float)
    return float(np.mean(n > cap)) if n.size else 0.0


def main(argv: list[str]) -> int:
    from fastscore.registry import default_model
    from fastscore.selection import ModelSelection
    from fastscore.study.data.datafile import default_data_dir
    from fastscore.study.data.envs import ENVS, env_class

    data = Path(argv[0]) if argv else default_data_dir()
    model = default_model()
    scorer = ModelSelection.resolve(model, "llamacpp").open()
    try:
        for name in ENVS:
            env = env_class(name)(data)
            lengths = [len(scorer.tokenizer.encode(text).ids) for text in env.reference_actions()]
            cap = data_cap(lengths)
            print(f"{name}: {len(lengths)} reference answers, p50 {np.median(lengths):.0f}, p99 "
                  f"{np.quantile(lengths, QUANTILE):.1f}, max {max(lengths)} tokens; derived cap {cap} (cuts "
                  f"{100 * cut_share(lengths, cap):.1f}%); the study's constant {env.max_new_tokens} (cuts "
                  f"{100 * cut_share(lengths, env.max_new_tokens):.1f}%)")
    finally:
        scorer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
