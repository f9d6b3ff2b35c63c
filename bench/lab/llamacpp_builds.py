"""Two or more llama.cpp builds on the same exact work: how far their numbers are apart, and whether each is
independent of its thread count.

Each build is a folder holding llama-cpp-python (`pip install --target DIR`, e.g. PyPI's wheel and the one
llamacpp/build_wheel.py makes), put first on a child process's import path. Every child scores the same token
requests (one shared call, the embedded model's f32 GGUF) and runs the same greedy decode steps on KV streams, at 1
and at 2 threads, and saves the log-probs and every step's logits; the parent prints max |Δ| between each pair.

    python -m fastscore.bench.lab.llamacpp_builds --build stock=/tmp/stock --build patched=/tmp/patched
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 6  # decode steps after the first logits


def dump(out: Path, threads: int) -> None:
    """In a child: score and decode the fixed workload, save everything to `out` (npz)."""
    import llama_cpp
    import numpy as np

    from fastscore.backends.llamacpp import LlamaCppBackend
    from fastscore.records import TokenRequest
    from fastscore.registry import default_model
    from fastscore.resolve import resolve

    path = resolve(default_model(), "llamacpp", "f32", progress=False).path
    # Six unrelated requests of 300-500 tokens: one shared scoring call; every stream of the decoder a context.
    requests = [TokenRequest(tokens=tuple(100 + (k * 7919 + j * 31) % 20000 for k in range(300 + 40 * j)),
                             score_from=150) for j in range(6)]
    arrays = {}
    with LlamaCppBackend(path, n_threads=threads) as backend:
        for j, scored in enumerate(backend.score_tokens(requests)):
            arrays[f"logprobs{j}"] = np.asarray(scored.logprobs)
        decoder = backend.decoder(8)
        logits = np.asarray(decoder.start([r.tokens for r in requests])).copy()
        arrays["step0"] = logits
        for step in range(1, STEPS + 1):
            tokens = [int(np.argmax(row)) for row in logits]
            logits = np.asarray(decoder.step(list(range(len(requests))), tokens)).copy()
            arrays[f"step{step}"] = logits
        decoder.close()
    np.savez(out, version=np.asarray(llama_cpp.__version__), **arrays)


def _max_diff(a, b, prefix: str) -> float:
    import numpy as np

    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files if k.startswith(prefix))


def compare(builds: dict[str, Path], scratch: Path) -> list[str]:
    import numpy as np

    runs = {}
    for (name, folder), threads in itertools.product(builds.items(), (1, 2)):
        out = scratch / f"{name}-{threads}.npz"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH"))
                                                           if p)}
        subprocess.run([sys.executable, "-m", "fastscore.bench.lab.llamacpp_builds", "--dump", str(out),
                        "--threads", str(threads)], env=env, check=True)
        runs[name, threads] = np.load(out)
    lines = [f"{name}: llama-cpp-python {runs[name, 1]['version']} from {folder}" for name, folder in builds.items()]
    pairs = [((n, 1), (n, 2)) for n in builds] + [((a, 1), (b, 1)) for a, b in itertools.combinations(builds, 2)]
    for x, y in pairs:
        a, b = runs[x], runs[y]
        later = max(_max_diff(a, b, f"step{s}") for s in range(1, STEPS + 1))
        lines.append(f"{x[0]} {x[1]}t vs {y[0]} {y[1]}t: max |d log-prob| {_max_diff(a, b, 'logprobs'):.3g}, "
                     f"max |d logit| first {_max_diff(a, b, 'step0'):.3g}, steps 1-{STEPS} {later:.3g}")
    return lines


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="append", default=[], metavar="NAME=DIR",
                        help="a llama-cpp-python folder (pip install --target); two or more")
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)  # the child's part
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump:
        dump(args.dump, args.threads)
        return
    builds = dict(b.split("=", 1) for b in args.build)
    if len(builds) < 2:
        parser.error("give two or more --build NAME=DIR")
    with tempfile.TemporaryDirectory(prefix="fastscore-builds-") as tmp:
        print("\n".join(compare({k: Path(v).resolve() for k, v in builds.items()}, Path(tmp))))


if __name__ == "__main__":
    main()
