"""bench/lab/stream_copy.py: a copy's cost is the step's median with copies queued less the plain one, per copy; the
lab runs on the real model and refuses layouts that do not fit."""

from click.testing import CliRunner

from fastscore.bench.lab import stream_copy


def test_one_copy_costs_the_difference_of_the_medians_per_copy():
    plain = [0.100, 0.104, 0.098]
    copied = [0.120, 0.150, 0.122]
    assert abs(stream_copy.copy_seconds(plain, copied, copies=4) - (0.122 - 0.100) / 4) < 1e-12


def test_layouts_that_do_not_fit_are_refused_before_loading_a_model():
    result = CliRunner().invoke(stream_copy.main, ["--live", "30", "--copies", "4", "--slots", "32"])
    assert result.exit_code == 2 and "need more than 32 slots" in result.output
    result = CliRunner().invoke(stream_copy.main, ["--length", "1000", "--longest", "1024"])
    assert result.exit_code == 2 and "do not fit 1024" in result.output


def test_the_lab_times_steps_with_and_without_copies(smollm_artefact):
    result = CliRunner().invoke(stream_copy.main, ["--live", "2", "--length", "40", "--longest", "256", "--slots", "4",
                                                   "--copies", "1", "--pairs", "3"])
    assert result.exit_code == 0, result.output
    print(result.output)
    assert "2 contexts of 40 tokens in 4 streams of 256 cells, 1 thread(s)" in result.output
    assert "one copy:" in result.output
