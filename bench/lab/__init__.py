"""Investigations of what bounds fastscore's speed (op profiles, decoding and study bounds, rank cost, serve load):
scripts run as `python -m fastscore.bench.lab.NAME`, which the package never imports (checked by .importlinter)."""
