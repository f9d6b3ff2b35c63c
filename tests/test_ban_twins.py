"""The ban-twin share read off committed rows (bench/lab/ban_twins.py): crafted rows, counted by hand."""

from __future__ import annotations

from fastscore.bench.lab.ban_twins import twin_shares
from fastscore.study.shards.rowfiles import write_rows


def _row(item: str, condition: str, greedy: str, decoded: bool = True, mass: float | None = None) -> dict:
    return {"item_id": item, "condition": condition, "greedy": greedy, "greedy_decoded": decoded,
            "banned_mass": mass}


def test_a_ban_that_never_blocked_counts_as_never_parted_and_its_characters_as_saved(tmp_path):
    rows = [
        # never parted: the same text, no mass removed (8 of the item's decoded characters 4 + 8 + 8 + 4)
        _row("a", "before", "xxxx"), _row("a", "after", "same.txt"), _row("a", "ban", "same.txt"),
        _row("a", "clean_retry", "xxxx"), _row("a", "success", "yyyy"),
        # parted: another text
        _row("b", "after", "failed"), _row("b", "ban", "other"),
        # the same text, but the ban removed mass at some step: it acted, the follower ran its own steps
        _row("c", "after", "zz"), _row("c", "ban", "zz", mass=0.1),
        # after read off the argmax chain: no twin decoded, not counted
        _row("d", "after", "chain", decoded=False), _row("d", "ban", "banned"),
    ]
    shard = tmp_path / "rows" / "seeded" / "tools" / "shard-00000"
    shard.mkdir(parents=True)
    write_rows(shard / "scores.parquet", rows)
    shares = twin_shares(tmp_path)
    decoded = 4 + 8 + 8 + 4 + (6 + 5) + (2 + 2) + 6
    assert shares == {"seeded/tools": {"items": 3, "never_parted": 1, "share_of_items": 1 / 3,
                                       "share_of_decoded_chars": 8 / decoded}}
