"""The quantisation check: does a weight variant keep the sign of the study's result (run, stats, report)."""
