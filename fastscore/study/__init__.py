"""The study: environments that build items from real data, the harness conditions, metrics and the report."""
