"""The study's analysis layer, pure numpy over the stored rows: the metrics and their summary (metrics.py), the
label contrasts (label.py), the copy control and pooled tables (control.py), power (power.py), the bootstrap and
Wilson statistics (stats.py), the failure's prior (prior.py), the harness-realism checks (sensitivity.py) and the
description redaction counts (redactions.py)."""
