"""How much greedy decoding the `ban` condition's follower saves, read off a committed run's rows (no model runs).

The study decodes `ban` (the `after` messages, the failed action banned) beside `after`. greedy_decode lets the
banned context follow the free one and run a sequence of its own only from where the ban makes it choose another
token. Where the committed `ban` completion equals `after`'s and the ban removed no probability mass, the ban never
blocked a token: the follower never parted, so its whole completion cost no decoding. Per failure source and
environment this prints those items' share and the share of all decoded greedy characters (a proxy for tokens) that
were theirs; both are counted over items whose `after` and `ban` completions were both decoded (not read off the
scoring pass's argmax chain). Sampled completions (on-policy items) are not in the rows and not counted.

    python -m fastscore.bench.lab.ban_twins results/smollm2-135m-full
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from fastscore.study.shards.rowfiles import read_rows


def twin_shares(run_dir: Path) -> dict[str, dict[str, float]]:
    """{"source/env": {"items", "never_parted", "share_of_items", "share_of_decoded_chars"}}."""
    out = {}
    for scores in sorted({p.parent.parent for p in Path(run_dir).glob("rows/*/*/shard-*/scores.parquet")}):
        by_item: dict[str, dict[str, dict]] = defaultdict(dict)
        for path in sorted(scores.glob("shard-*/scores.parquet")):
            for row in read_rows(path):
                by_item[row["item_id"]][row["condition"]] = row
        items = never = 0
        decoded_chars = saved_chars = 0
        for conditions in by_item.values():
            decoded = {c: r for c, r in conditions.items() if r.get("greedy_decoded") and r.get("greedy") is not None}
            # clean_retry stands for before (the same messages): decoded once
            decoded_chars += sum(len(r["greedy"]) for c, r in decoded.items() if c != "clean_retry")
            after, ban = decoded.get("after"), decoded.get("ban")
            if after is None or ban is None:
                continue
            items += 1
            if ban["greedy"] == after["greedy"] and not ban.get("banned_mass"):
                never += 1
                saved_chars += len(ban["greedy"])
        key = f"{scores.parent.name}/{scores.name}"
        out[key] = {"items": items, "never_parted": never, "share_of_items": never / items if items else 0.0,
                    "share_of_decoded_chars": saved_chars / decoded_chars if decoded_chars else 0.0}
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print("| source/env | items (after and ban decoded) | ban never parted from after | share of decoded greedy "
          "characters |\n|---|---|---|---|")
    for key, s in twin_shares(Path(args[0])).items():
        print(f"| {key} | {s['items']} | {s['never_parted']} ({100 * s['share_of_items']:.0f}%) | "
              f"{100 * s['share_of_decoded_chars']:.0f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
