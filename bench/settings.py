"""`fastscore bench throughput --set KEY=VALUE`: the sizes of the measurements, kept out of the command's options.

Their defaults (BenchOptions') are what the documented figures were measured with; a test or a quick look changes
them, e.g. `--set pp_tokens=16 --set greedy_batches=1,8`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fastscore.bench.run import BenchOptions
from fastscore.errors import RequestError

# The least value of each integer setting (a prefill needs two tokens to score one; a matmul below 16 measures
# nothing but overhead).
INT_SETTINGS = {"pp_tokens": 2, "per_request_repeats": 1, "per_request_limit": 1, "reference_repeats": 1,
                "new_tokens": 1, "greedy_repeats": 1, "sgemm_n": 16}
LIST_SETTINGS = ("greedy_batches", "conditions")  # comma-separated


def settings_help() -> str:
    """Every setting with its default, for --help."""
    defaults = {f.name: f.default for f in dataclasses.fields(BenchOptions)}
    shown = {k: ",".join(map(str, v)) if isinstance(v, tuple) else ("all" if v is None else v)
             for k, v in defaults.items() if k in (*INT_SETTINGS, *LIST_SETTINGS)}
    return ", ".join(f"{k} ({v})" for k, v in shown.items())


def parse_settings(pairs: Sequence[str]) -> dict[str, object]:
    """`key=value` strings -> BenchOptions fields, typed; an unknown key or a bad value is a RequestError."""
    fields: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in (*INT_SETTINGS, *LIST_SETTINGS):
            raise RequestError(f"--set {pair!r}: expected KEY=VALUE, KEY one of {', '.join(INT_SETTINGS)}, "
                               f"{', '.join(LIST_SETTINGS)}")
        items = tuple(v.strip() for v in text.split(",") if v.strip())
        if key == "conditions":
            fields[key] = items or None
            continue
        try:
            numbers = tuple(int(v) for v in items)
        except ValueError:
            raise RequestError(f"--set {pair!r}: expected whole numbers") from None
        least = INT_SETTINGS.get(key, 1)
        if not numbers or min(numbers) < least or (key in INT_SETTINGS and len(numbers) != 1):
            raise RequestError(f"--set {pair!r}: expected {'one number' if key in INT_SETTINGS else 'numbers'} "
                               f"of at least {least}")
        fields[key] = numbers if key in LIST_SETTINGS else numbers[0]
    return fields
