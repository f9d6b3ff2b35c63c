"""The registry of checkpoints: registry.toml is data; fastscore.registry reads it."""
