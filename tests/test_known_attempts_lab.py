"""bench/lab/known_attempts: its pass order and table (the timing itself needs a finished study run)."""

from fastscore.bench.lab.known_attempts import DECODED, KNOWN, pass_order, table_rows


def test_each_variant_runs_first_as_often_as_second():
    assert pass_order(1) == [KNOWN, DECODED, DECODED, KNOWN]
    order = pass_order(2)
    assert order.count(KNOWN) == order.count(DECODED) == 4


def test_the_table_gives_each_variants_passes_their_mean_and_tokens():
    passes = [{"label": KNOWN, "seconds": 31.0, "tokens": 8769}, {"label": DECODED, "seconds": 40.0, "tokens": 13324},
              {"label": DECODED, "seconds": 42.0, "tokens": 13324}, {"label": KNOWN, "seconds": 29.0, "tokens": 8769}]
    assert table_rows(passes) == [f"| {KNOWN} | 31.0 / 29.0 | 30.0 | 8,769 |",
                                  f"| {DECODED} | 40.0 / 42.0 | 41.0 | 13,324 |"]
