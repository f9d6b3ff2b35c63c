"""The benchmark's printed output: a short human table by default, the detailed tables with --details, and one JSON
line holding every figure with --json (the figures' internal targets live only in that JSON)."""

from __future__ import annotations

import json
from typing import Any


def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{digits}f}" if abs(x) >= 0.01 or x == 0 else f"{x:.2e}"
    return str(x)


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def build_line(build: dict) -> str:
    """One line naming the llama.cpp build a worker loaded (fastscore.bench.llamacpp_build)."""
    blas = f"; {build['openblas']}" if build.get("openblas") else ""
    return f"llama-cpp-python {build['llama_cpp_python']}, ggml backends {', '.join(build['ggml_backends'])}{blas}"


def render_short(summary: dict[str, Any]) -> str:
    """What a person reads first: per backend and type, scoring speed with and without prefix sharing, the end-to-end
    time, memory, and how far its scores are from the reference's."""
    w, e2e = summary["workload"], summary["end_to_end"]
    parts = [f"fastscore bench: {summary['options']['model']}, {summary['threads']} threads, median of "
             f"{summary['options']['repeats']} runs, {summary['date_utc']}",
             f"workload: {w['items']} items, {w['contexts']} contexts, {w['requests']} requests ({', '.join(w['envs'])})",
             ""]
    rows = []
    for key, b in summary["backends"].items():
        end = e2e.get(key) if isinstance(e2e.get(key), dict) else None
        diff = e2e.get(f"max_abs_diff_vs_reference {key}")
        if diff is None and key == f"llamacpp:{summary.get('best_llamacpp_type')}":
            diff = e2e.get("max_abs_diff_best_vs_reference")
        rows.append([key, _f(b["requested_tokens_per_s"], 0), _f(b["per_request_requested_tokens_per_s"], 0),
                     _f(b["sharing_speedup"], 1) + "x", _f(end["seconds"], 2) if end else "-",
                     "-" if diff is None else f"{diff:.1e}", _f(b["max_rss_mb"], 0)])
    builds = dict.fromkeys(build_line(b["llamacpp_build"]) for b in summary["backends"].values()
                           if b.get("llamacpp_build"))
    parts[2:2] = [f"llama.cpp build: {line}" for line in builds]
    reference = e2e.get("reference:fp32")
    if reference:
        rows.append(["reference:fp32 (transformers)", "-", "-", "-", _f(reference["seconds"], 2), "-", "-"])
    parts.append(_grid(["backend:type", "tokens/s shared", "tokens/s one by one", "sharing", "end to end s",
                        "max |Δ| vs reference", "memory MB"], rows))
    g = summary["greedy"]
    if g:
        speeds = [f"{b}: {_f(v['batched_tokens_per_s'])}" for b, v in g.items() if isinstance(v, dict)]
        parts += ["", f"greedy decoding ({g['backend']}), tokens/s by contexts decoded together: " + "; ".join(speeds)]
    parts += ["", "tokens/s: requested (scored) tokens per second; shared: every request through one prefix trie;",
              "one by one: each request alone; max |Δ|: nats per request. All figures: --json; detailed tables: --details."]
    return "\n".join(parts)


def render_details(summary: dict[str, Any]) -> str:
    w = summary["workload"]
    r = summary["roofline"]
    parts = [
        f"fastscore bench — {summary['date_utc']} — {summary['options']['model']} — threads {summary['threads']} "
        f"— repeats {summary['options']['repeats']} (medians; warm-up not counted)",
        f"workload: {w['items']} items, {w['contexts']} contexts, {w['requests']} requests "
        f"(envs {', '.join(w['envs'])}); same token requests on every backend: {_f(w['same_requests_on_every_backend'])}",
        f"load average (1/5/15 min) at start {summary['machine']['load_average_at_start']}, at end "
        f"{[round(x, 2) for x in summary['machine']['load_average_1_5_15_at_end']]} on {summary['machine']['cpu_count']} CPUs",
        f"sgemm limit: {_f(summary['sgemm']['gflops'])} GFLOP/s (float32 {summary['sgemm']['n']}² numpy matmul)",
        f"FLOPs/token: {_f(r['flops_per_token_prefill_without_lm_head'] / 1e6)} M without lm_head, "
        f"{_f(r['flops_per_token_prefill_with_lm_head'] / 1e6)} M with (at pp mean position "
        f"{_f(r['mean_position_prefill'])}); workload mean position {_f(r['mean_position_workload_trie'])}: "
        f"{_f(r['flops_per_token_workload_without_lm_head'] / 1e6)} M / {_f(r['flops_per_token_workload_with_lm_head'] / 1e6)} M",
        "",
    ]
    rows = []
    for key, b in summary["backends"].items():
        rows.append([key, _f(b["requested_tokens"]), _f(b["computed_tokens"]), _f(b["trie_minimal_tokens"]),
                     _f(b["unique_tokens_per_s"]), _f(b["prefill_tokens_per_s"]), _f(b["unique_vs_prefill"], 2), _f(b["shared_vs_prefill_gflops"], 2),
                     _f(b["per_request_requested_tokens_per_s"]), _f(b["sharing_speedup"], 1),
                     _f(b["prefill_gflops"]), _f(b["prefill_fraction_of_sgemm"], 2),
                     _f(b["shared_fraction_of_sgemm"], 2), _f(b["shared_fraction_of_roofline"], 2),
                     _f(b["max_rss_mb"], 0)])
    parts.append(_grid(["config", "requested", "computed", "trie-min", "uniq tok/s", "pp tok/s", "uniq/pp", "GFLOP/s vs pp",
                        "alone req tok/s", "share x", "pp GFLOP/s", "pp/sgemm", "shared/sgemm", "roofline",
                        "RSS MB"], rows))
    parts += [f"{key}: {build_line(b['llamacpp_build'])}" for key, b in summary["backends"].items()
              if b.get("llamacpp_build")]
    e = summary["end_to_end"]
    parts += ["", f"end to end (best llama.cpp type: {summary['best_llamacpp_type']}):"]
    for key, m in e.items():
        if isinstance(m, dict):
            parts.append(f"  {key}: {_f(m['seconds'], 2)} s for {m['requests']} requests "
                         f"({(m.get('mode') or 'shared').replace('_', ' ')}; {m['weights']})")
    for key, value in e.items():
        if not isinstance(value, dict) and key != "diff_unit":
            parts.append(f"  {key}: {_f(value, 4)}")
    g = summary["greedy"]
    if g:
        parts += ["", f"greedy decoding ({g['backend']}, decode phase only, fixed steps; its prefill "
                      f"{_f(g['prefill_tokens_per_s'])} tok/s):"]
        rows = [[b, _f(v["batched_tokens_per_s"]), _f(v["sequential_tokens_per_s"]), _f(v["speedup"], 2),
                 _f(v["batched_vs_prefill"], 2), _f(v.get("unified_tokens_per_s")), _f(v.get("streams_vs_unified"), 2)]
                for b, v in g.items() if isinstance(v, dict)]
        parts.append(_grid(["contexts", "batched tok/s", "one-at-a-time tok/s", "speedup", "batched/prefill",
                            "unified cache + FA tok/s", "streams/unified"], rows))
    bounds = summary.get("bounds") or {}
    if bounds:
        parts += ["", "bounds (same run):",
                  f"  workload roofline {_f(bounds['roofline_seconds'], 2)} s; the transformers prefix-KV peer's time "
                  f"over it (the speedup an engine at the roofline would have): "
                  f"{_f(bounds['max_speedup_vs_prefix_kv_at_roofline'], 2)}"]
        parts += [f"  raw prefill vs sgemm, {k}: {_f(v, 2)} (shared scoring cannot run above its own prefill rate)"
                  for k, v in bounds["prefill_fraction_of_sgemm"].items()]
    return "\n".join(parts)


def json_line(summary: dict[str, Any]) -> str:
    return json.dumps(summary, sort_keys=True, allow_nan=False, separators=(",", ":"))


def print_and_save(result: dict[str, Any], json_out, render_fn, as_json: bool = False) -> None:
    """render_fn(result), or with as_json the one JSON line instead; the JSON is also written to json_out if given."""
    import click

    from fastscore import outputs

    line = json_line(result)
    click.echo(line if as_json else render_fn(result))
    if json_out is not None:
        outputs.ensure_parent(json_out)
        outputs.write_text_atomic(json_out, line + "\n")
