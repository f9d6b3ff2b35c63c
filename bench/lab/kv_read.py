"""What a decoding step's attention costs against reading its KV cache once (x86 with AVX-512 only).

A decoding step on KV streams multiplies each stream's one query row per head by that stream's K cells (KQ) and its
softmax row by its transposed V cells (KQV). This compiles a small C program (the machine's `cc`, as llama.cpp is
built) that lays out f32 K and V as llama.cpp's streams do (per layer and stream: `kv_size` cells of
`kv_heads x head_dim` floats for K, `kv_heads x head_dim` rows of `kv_size` cells for V) and times, per step of
`streams` rows over `layers` layers:

- a plain read of the cells in use (a vector sum): what reading those bytes once costs on one core;
- the products as tinyBLAS runs them for one query row (4-row tiles, one column, each element summed over
  16-float steps into one accumulator, then added across its lanes), one product per query head;
- the same products with the query heads that share a KV head as the columns of one product (tiles of 4 rows by
  that many columns).

It allocates K, V and the queries for every stream and layer at once: about 1.5 GB at the defaults.

    python -m fastscore.bench.lab.kv_read
    python -m fastscore.bench.lab.kv_read --streams 32 --cells 448 --repeats 5

The defaults are the embedded SmolLM2-135M's shape (30 layers, 9 query heads on 3 KV heads of 64 dims) at 640 cells
per stream in a 1,024-cell stream, about what the study's decoding steps attend to (docs/performance.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import click

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec*1e-9; }

// C[j*ldc + i] = sum over l of A[i*lda + l] * B[j*ldb + l], for i < m (a multiple of 4), j < n (1 or 3), k a multiple
// of 16: tinyBLAS's order (one accumulator per element over 16-float steps, then its lanes added).
static void product(const float *A, long lda, const float *B, long ldb, float *C, long ldc, long m, int n, long k) {
    for (long ii = 0; ii < m; ii += 4) {
        __m512 acc[3][4];
        for (int j = 0; j < n; j++) for (int i = 0; i < 4; i++) acc[j][i] = _mm512_setzero_ps();
        for (long l = 0; l < k; l += 16) {
            __m512 a[4];
            for (int i = 0; i < 4; i++) a[i] = _mm512_loadu_ps(A + lda*(ii + i) + l);
            for (int j = 0; j < n; j++) {
                const __m512 b = _mm512_loadu_ps(B + ldb*j + l);
                for (int i = 0; i < 4; i++) acc[j][i] = _mm512_fmadd_ps(a[i], b, acc[j][i]);
            }
        }
        for (int j = 0; j < n; j++) for (int i = 0; i < 4; i++) C[ldc*j + ii + i] = _mm512_reduce_add_ps(acc[j][i]);
    }
}

static float read_rows(const float *A, long lda, long rows, long len) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long r = 0; r < rows; r++)
        for (long l = 0; l < len; l += 64) {
            s0 = _mm512_add_ps(s0, _mm512_loadu_ps(A + r*lda + l));
            s1 = _mm512_add_ps(s1, _mm512_loadu_ps(A + r*lda + l + 16));
            s2 = _mm512_add_ps(s2, _mm512_loadu_ps(A + r*lda + l + 32));
            s3 = _mm512_add_ps(s3, _mm512_loadu_ps(A + r*lda + l + 48));
        }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

int main(int argc, char **argv) {
    if (argc != 9) return 2;
    const long S = atol(argv[1]), L = atol(argv[2]), KV = atol(argv[3]), U = atol(argv[4]);
    const long KVH = atol(argv[5]), D = atol(argv[6]), H = atol(argv[7]), R = atol(argv[8]);
    const long G = H/KVH, E = KVH*D, chunk = KV*E;
    float *K = aligned_alloc(64, S*L*chunk*sizeof(float)), *V = aligned_alloc(64, S*L*chunk*sizeof(float));
    float *Q = aligned_alloc(64, S*L*H*D*sizeof(float)), *P = aligned_alloc(64, S*L*H*KV*sizeof(float));
    float *O = aligned_alloc(64, H*(KV > D ? KV : D)*sizeof(float));  // KQ writes H rows of KV, KQV H rows of D
    if (!K || !V || !Q || !P || !O) return 3;
    for (long i = 0; i < S*L*chunk; i++) { K[i] = (float)(i % 97)*0.01f; V[i] = (float)(i % 89)*0.01f; }
    for (long i = 0; i < S*L*H*D; i++) Q[i] = (float)(i % 13)*0.1f;
    for (long i = 0; i < S*L*H*KV; i++) P[i] = (float)(i % 7)*0.01f;
    float sink = 0;
    for (int mode = 0; mode < 6; mode++) {
        double best = 1e30;
        for (long rep = 0; rep < R; rep++) {
            const double t = now();
            for (long c = 0; c < S*L; c++) {
                const float *k = K + c*chunk, *v = V + c*chunk, *q = Q + c*H*D, *p = P + c*H*KV;
                switch (mode) {
                case 0: sink += read_rows(k, U*E, 1, U*E); break;
                case 1:
                    for (long h = 0; h < H; h++) product(k + (h/G)*D, E, q + h*D, D, O + h*KV, KV, U, 1, D);
                    break;
                case 2:
                    for (long g = 0; g < KVH; g++) product(k + g*D, E, q + g*G*D, D, O + g*G*KV, KV, U, G, D);
                    break;
                case 3: sink += read_rows(v, KV, E, U); break;
                case 4:
                    for (long h = 0; h < H; h++) product(v + (h/G)*D*KV, KV, p + h*KV, KV, O + h*D, D, D, 1, U);
                    break;
                case 5:
                    for (long g = 0; g < KVH; g++) product(v + g*D*KV, KV, p + g*G*KV, KV, O + g*G*D, D, D, G, U);
                    break;
                }
            }
            const double dt = now() - t;
            if (dt < best) best = dt;
            sink += O[1];
        }
        printf("%d %.6f\n", mode, best);
    }
    fprintf(stderr, "%g\n", sink);
    return 0;
}
"""

MODES = ("K: plain read", "KQ: one product per query head", "KQ: query heads of a KV head in one product",
         "V: plain read", "KQV: one product per query head", "KQV: query heads of a KV head in one product")


def has_avx512() -> bool:
    from fastscore.backends.llamacpp_compact import cpu_flags

    return "avx512f" in cpu_flags().split()


def _compile(folder: Path) -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise click.ClickException("no C compiler found (set CC)")
    source, binary = folder / "kv_read.c", folder / "kv_read"
    source.write_text(SOURCE)
    # AMX is switched off as in llamacpp/build_wheel.py: some VMs report it and trap on its instructions.
    subprocess.run([compiler, "-O3", "-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16",
                    str(source), "-o", str(binary)], check=True)
    return binary


@click.command()
@click.option("--streams", default=32, show_default=True, type=click.IntRange(1), help="Rows (one per KV stream).")
@click.option("--layers", default=30, show_default=True, type=click.IntRange(1))
@click.option("--kv-size", default=1024, show_default=True, type=click.IntRange(64), help="Cells per stream.")
@click.option("--cells", default=640, show_default=True, type=click.IntRange(64),
              help="Cells in use per stream (a multiple of 64, at most --kv-size).")
@click.option("--kv-heads", default=3, show_default=True, type=click.IntRange(1))
@click.option("--head-dim", default=64, show_default=True, type=click.IntRange(16))
@click.option("--heads", default=9, show_default=True, type=click.IntRange(1), help="Query heads.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Runs per mode; the best counts.")
def main(streams: int, layers: int, kv_size: int, cells: int, kv_heads: int, head_dim: int, heads: int,
         repeats: int) -> None:
    """Time a decoding step's KQ and KQV against a plain read of the same KV bytes (one core)."""
    seconds = timed_modes(streams, layers, kv_size, cells, kv_heads, head_dim, heads, repeats)
    mb = streams * layers * cells * kv_heads * head_dim * 4 / 1e6
    click.echo(f"{streams} streams x {layers} layers, {cells} of {kv_size} cells, {heads} query heads on {kv_heads} KV "
               f"heads of {head_dim}: K and V {mb:.1f} MB each per step, one core, best of {repeats}")
    click.echo(f"{'':46s}  ms/step   GB/s  plain read's ms / these")
    for name, ms, gbs, of_read in table_rows(seconds, mb):
        click.echo(f"{name:46s}  {ms:7.1f}  {gbs:5.1f}  {of_read:23.2f}")


def timed_modes(streams: int, layers: int, kv_size: int, cells: int, kv_heads: int, head_dim: int, heads: int,
                repeats: int) -> dict[int, float]:
    """{mode (an index into MODES): best seconds per step}, from the compiled program."""
    if cells % 64 or cells > kv_size or head_dim % 16 or heads % kv_heads or heads // kv_heads > 3:
        raise click.UsageError("--cells: a multiple of 64 up to --kv-size; --head-dim: a multiple of 16; "
                               "--heads: 1 to 3 query heads per KV head")
    if not has_avx512():
        raise click.ClickException("kv_read times AVX-512 kernels (tinyBLAS's f32 tiles on this machine); this CPU "
                                   "has no avx512f")
    with tempfile.TemporaryDirectory() as folder:
        binary = _compile(Path(folder))
        run = subprocess.run([str(binary), *map(str, (streams, layers, kv_size, cells, kv_heads, head_dim, heads,
                                                      repeats))], capture_output=True, text=True)
    if run.returncode != 0:
        raise click.ClickException(f"the timing program failed (exit {run.returncode}; 3: out of memory for "
                                   f"{streams} streams x {layers} layers x {kv_size} cells)")
    return {int(mode): float(s) for mode, s in (line.split() for line in run.stdout.splitlines())}


def table_rows(seconds: dict[int, float], mb: float) -> list[tuple[str, float, float, float]]:
    """(mode, ms per step, GB/s, the plain read's seconds / the mode's) per mode: `seconds` per mode as the program
    prints them, `mb` the megabytes of K (= of V) a step reads. The last is the mode's rate as a share of the plain
    read's, K's modes against K's read and V's against V's."""
    return [(name, seconds[mode] * 1e3, mb / 1e3 / seconds[mode], seconds[0 if mode < 3 else 3] / seconds[mode])
            for mode, name in enumerate(MODES)]


if __name__ == "__main__":
    main()
