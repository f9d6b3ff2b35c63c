"""`fastscore sweep`: the study over a grid of models × weight variants × environments × failure sources, cut into
shards that run in this process or on Ray workers, resumable shard by shard, summarised across models."""
