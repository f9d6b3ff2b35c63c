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


def test_each_mode_is_set_against_its_own_plain_read():
    # K's modes against K's plain read (mode 0), V's against V's (mode 3): a mode twice as slow reads at half the rate
    seconds = {0: 0.010, 1: 0.020, 2: 0.040, 3: 0.050, 4: 0.100, 5: 0.025}
    rows = {name: rest for name, *rest in kv_read.table_rows(seconds, mb=100.0)}
    assert rows["K: plain read"] == [10.0, 10.0, 1.0]
    assert rows["KQ: one product per query head"] == [20.0, 5.0, 0.5]
    assert rows["KQ: query heads of a KV head in one product"][2] == 0.25
    assert rows["V: plain read"] == [50.0, 2.0, 1.0]
    assert rows["KQV: one product per query head"][2] == 0.5
    assert rows["KQV: query heads of a KV head in one product"][2] == 2.0
