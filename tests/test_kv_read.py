"""bench/lab/kv_read.py: the C program compiles, runs every mode on a small layout and prints one row per mode."""

import pytest
from click.testing import CliRunner

from fastscore.bench.lab import kv_read


@pytest.mark.skipif(not kv_read.has_avx512(), reason="kv_read times AVX-512 kernels")
def test_kv_read_prints_each_mode_with_its_rate_against_the_plain_read():
    result = CliRunner().invoke(kv_read.main, ["--streams", "2", "--layers", "2", "--kv-size", "128", "--cells", "64",
                                               "--repeats", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "2 streams x 2 layers, 64 of 128 cells" in lines[0]
    rows = {name: line for name in kv_read.MODES for line in lines[2:] if line.startswith(name)}
    assert len(rows) == len(kv_read.MODES) == 6
    # each plain read is its own yardstick: 1.00 against itself
    assert rows["K: plain read"].split()[-1] == "1.00" and rows["V: plain read"].split()[-1] == "1.00"
    assert all(float(line.split()[-2]) > 0 for line in rows.values())  # GB/s


def test_kv_read_refuses_cells_it_cannot_tile():
    result = CliRunner().invoke(kv_read.main, ["--cells", "100"])
    assert result.exit_code == 2 and "--cells: a multiple of 64" in result.output
