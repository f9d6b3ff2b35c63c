"""Adapters that let other tools drive fastscore (lm-evaluation-harness). Each imports its tool only when used."""
