"""The study, in layers (each imports only those below it): the runs (runner.py, sources.py, shards/, quantcheck/),
the report (report/), the analysis of the stored rows (analysis/), the model-bound stages (stages/) and the data:
items, environments and conditions (data/)."""
