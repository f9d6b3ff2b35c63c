"""The full study as shards committed to git (fastscore study-shards): a run folder under results/ holds

- manifest.json: the run's settings, its plan's hashes, and per shard its window, n items, seconds, start and end
  (UTC), the code (commit, dirty), the weights' SHA-256, the machine, and its row files' hashes;
- plan/<env>.items.parquet, plan/<env>.skipped.parquet: every seeded item in the seed's order (plan.py);
- rows/<source>/<env>/shard-NNNNN/<kind>.parquet: each shard's rows, one file per JSONL file of a study folder
  (items, skipped, logprobs, scores, item_errors, sensitivity), zstd-compressed (rowfiles.py);
- summary.json, report.md, plots, and seeded/ and model/ with each source's own (merge.py, `report`);
- .scratch/ (git-ignored): the shard in progress.
"""
