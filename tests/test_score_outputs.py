"""Every file a `score` run writes is named in one place (ScoreOutputs.files) and none of them may be the input or
another of them, whatever the spelling; OUT is locked for the run. Library level; the CLI's one-line messages and
exit codes are in test_cli_safety.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastscore.errors import OutputBusyError, OutputError
from fastscore.outputs import ExclusiveLock
from fastscore.requests_io import score_file
from fastscore.score_outputs import ScoreOutputs

REQUEST = b'{"id": "a", "messages": [{"role": "user", "content": "Say hi"}], "candidates": ["Hi"]}\n'
ROLES = [(fmt, role) for fmt in ("jsonl", "csv") for role in ScoreOutputs.of(Path("o"), fmt).files()]


def _spellings(tmp_path: Path, target: Path) -> dict[str, tuple[Path, Path]]:
    """(the input as given, --out as given) for the same two files, spelled four ways."""
    (tmp_path / "sub").mkdir(exist_ok=True)
    link = tmp_path / "sub" / "link.jsonl"
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    return {
        "plain": (target, tmp_path / "o"),
        "dot": (Path(os.path.relpath(target)), Path(".") / os.path.relpath(tmp_path / "o")),
        "absolute": (target.resolve(), tmp_path / "sub" / ".." / "o"),
        "symlink": (link, tmp_path / "o"),
    }


@pytest.mark.parametrize("spelling", ["plain", "dot", "absolute", "symlink"])
@pytest.mark.parametrize("fmt, role", ROLES, ids=[f"{fmt}-{role}" for fmt, role in ROLES])
def test_no_file_of_the_run_may_be_the_input(tmp_path, monkeypatch, fmt, role, spelling):
    monkeypatch.chdir(tmp_path)
    target = ScoreOutputs.of(tmp_path / "o", fmt).files()[role]
    target.write_bytes(REQUEST)
    requests, out = _spellings(tmp_path, target)[spelling]
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OutputError, match="is the input file") as err:
        ScoreOutputs.of(out, fmt).check([requests])
    print(err.value)
    assert target.read_bytes() == REQUEST and sorted(p.name for p in tmp_path.iterdir()) == before


def test_two_files_of_the_run_may_not_be_the_same_file(tmp_path):
    names = ScoreOutputs.of(tmp_path / "o.jsonl")
    (tmp_path / "o.jsonl").write_text("previous results\n")
    (tmp_path / "o.jsonl.meta.json").symlink_to(tmp_path / "o.jsonl")  # the sidecar would overwrite OUT
    with pytest.raises(OutputError, match="are the same file"):
        names.check([tmp_path / "requests.jsonl"])
    ScoreOutputs.of(tmp_path / "other.jsonl").check([tmp_path / "o.jsonl"])  # distinct files are fine


def test_score_file_refuses_a_skipped_list_named_like_its_input_before_touching_it(tmp_path, fake_scorer):
    requests = tmp_path / "o.jsonl.skipped.jsonl"  # the probe that deleted its input at 907a12e
    requests.write_bytes(REQUEST)
    with pytest.raises(OutputError, match="skipped-lines list .* is the input file"):
        score_file(fake_scorer, requests, tmp_path / "o.jsonl", progress=False, on_error="skip")
    assert requests.read_bytes() == REQUEST and sorted(p.name for p in tmp_path.iterdir()) == [requests.name]


def test_a_held_out_is_refused_naming_the_holder_and_left_untouched(tmp_path, fake_scorer):
    requests = tmp_path / "r.jsonl"
    requests.write_bytes(REQUEST)
    out = tmp_path / "o.jsonl"
    names = ScoreOutputs.of(out)
    with ExclusiveLock(names.lock_file, "another holder", ""):  # another open file description: another run
        with pytest.raises(OutputBusyError, match=f"--out {out} is in use by another run \\(pid {os.getpid()}"):
            score_file(fake_scorer, requests, out, progress=False, resume=True)
        assert not out.exists() and not (tmp_path / "o.jsonl.partial").exists()
    score_file(fake_scorer, requests, out, progress=False)  # released: the next run may start
    assert out.read_bytes().count(b"\n") == 1


def test_a_refused_table_run_leaves_the_record_holders_partial_alone(tmp_path):
    """`--format csv --out X --restart` while another run writes X.jsonl: refused before X.jsonl.partial is touched
    (the record's lock is taken before the partial file is looked at, not only inside score_file)."""
    from fastscore.score_run import run_score

    requests = tmp_path / "r.jsonl"
    requests.write_bytes(REQUEST)
    record = tmp_path / "X.jsonl"
    partial = tmp_path / "X.jsonl.partial"
    partial.write_bytes(b'{"id": "a"}\n')
    with ExclusiveLock(ScoreOutputs.of(record).lock_file, "another holder", ""):  # the run writing X.jsonl
        with pytest.raises(OutputBusyError):
            run_score(requests, tmp_path / "X", model=None, backend="llamacpp", quant=None, out_format="csv",
                      restart=True)
    assert partial.read_bytes() == b'{"id": "a"}\n'
