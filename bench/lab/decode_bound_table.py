"""The decode-bound benchmark's printed table and JSON line (fastscore.bench.lab.decode_bound measures)."""

from __future__ import annotations

from pathlib import Path


def render(result: dict) -> str:
    from fastscore.bench.table import _f, _grid, build_line

    o, m = result["options"], result["machine"]
    mb = lambda b: _f(b / 1e6, 1)  # noqa: E731
    tied = ", tied to the embedding" if result["tied"] else ""
    parts = [
        f"decode bound — {result['date_utc']} — {o['model']} llama.cpp {o['quant']} ({Path(result['gguf']).name}), "
        f"KV {o['kv_type']}, threads {o['threads']}, {o['steps']} steps, repeats {o['repeats']} (medians)",
        f"load average at start {m['load_average_at_start']}, at end {m['load_average_at_end']} on {m['cpu_count']} "
        f"CPUs, nice {m['nice']}",
        *([f"llama.cpp: {build_line(result['llamacpp_build'])}"] if result.get("llamacpp_build") else []),
        f"prefill (pp{result['prefill']['tokens']}, random tokens): {_f(result['prefill']['tokens_per_s'])} tok/s",
        f"weights read per step: {mb(result['weights_bytes_per_step'])} MB (GGUF tensors "
        f"{mb(result['tensor_bytes_total'])} MB, lm_head {mb(result['lm_head_bytes'])} MB{tied}); "
        f"KV {_f(result['kv_bytes_per_cell'] / 1e3)} KB per cell",
        "",
    ]
    rows = [[str(c["length"]), str(c["streams"]), _f(c["tokens_per_s"]), _f(c["fraction_of_prefill"], 2),
             mb(c["weights_bytes_per_step"]), mb(c["kv_bytes_per_step"]), mb(c["kv_bytes_per_step_padded"]),
             _f(c["gb_per_s"], 2), _f(c["gb_per_s_padded"], 2), _f(c["decoder_groups"])] for c in result["cells"]]
    parts.append(_grid(["context", "streams", "decode tok/s", "/prefill", "weights MB/step", "KV MB/step",
                        "KV MB/step (padded)", "GB/s", "GB/s (padded)", "groups"], rows))
    parts.append(f"decode tok/s: tokens fed through the decoder's steps ({o['steps'] - 1} per context) over the decode "
                 "phase; GB/s: (weights + KV) bytes per step over the time inside the decoder's steps; padded: the "
                 "cells llama.cpp attends (256-cell blocks per stream)")
    c = result["cores"]
    if c:
        parts += ["", f"cores, context {c['length']} x {c['streams']} streams, each process decoding the whole cell: "
                      f"1 process x {c['threads']} threads {_f(c['one_process_tokens_per_s'])} tok/s; "
                      f"{c['processes']} processes x 1 thread {_f(c['processes_aggregate_tokens_per_s'])} tok/s "
                      f"aggregate (each: {', '.join(_f(x) for x in c['processes_own_tokens_per_s'])}); "
                      f"ratio {_f(c['aggregate_vs_one_process'], 2)}"]
    return "\n".join(parts)
