"""Writing outputs safely: an input is never an output, OUT is replaced only when complete, a resumed partial output
keeps its finished lines and drops a torn one, and an output folder has one run at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fastscore.errors import OutputError, ResumeConfigError
from fastscore.outputs import (
    HOLDER_FILE,
    OutDirLock,
    PartialOutput,
    check_not_an_input,
    partial_path,
    settings_path,
    write_text_atomic,
)

SETTINGS = {"weights": "model.gguf", "generate": False}


def test_an_output_that_is_an_input_is_refused_whatever_its_spelling(tmp_path):
    requests = tmp_path / "same.jsonl"
    requests.write_text('{"id": 1}\n')
    os.link(requests, tmp_path / "hardlink.jsonl")
    (tmp_path / "sub").mkdir()
    for spelling in (requests, tmp_path / "sub" / ".." / "same.jsonl", tmp_path / "hardlink.jsonl"):
        with pytest.raises(OutputError, match="is the input file"):
            check_not_an_input(spelling, [requests])
    check_not_an_input(tmp_path / "other.jsonl", [requests])  # a new file is fine
    assert requests.read_text() == '{"id": 1}\n'


def test_out_is_replaced_only_on_commit(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    partial = PartialOutput(out, SETTINGS, resume=False)
    partial.write([{"id": 1}])
    partial.close()  # a failure: OUT is untouched, the finished line is in OUT.partial
    assert out.read_text() == "previous results\n"
    assert partial_path(out).read_text() == '{"id": 1}\n'
    resumed = PartialOutput(out, SETTINGS, resume=True)
    assert resumed.done == {"1"}
    resumed.write([{"id": 2}])
    resumed.commit()
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, 2]
    assert not partial_path(out).exists() and not (tmp_path / "out.jsonl.partial.json").exists()


def test_a_commit_that_fails_after_its_rename_says_the_output_is_complete(tmp_path, monkeypatch):
    import fastscore.outputs as outputs

    out = tmp_path / "out.jsonl"
    partial = PartialOutput(out, SETTINGS, resume=False)
    partial.write([{"id": 1}, {"id": 2}])

    def failing_fsync(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(outputs, "fsync_path", failing_fsync)  # the folder's fsync, after the rename
    with pytest.raises(OutputError, match="cannot write"):
        partial.commit()
    partial.close()
    note = partial.kept()
    assert f"all 2 lines are in {out}" in note and "--resume" not in note, note
    assert out.read_text() == '{"id": 1}\n{"id": 2}\n' and not partial_path(out).exists()


def test_a_partial_output_is_not_discarded_without_resume_or_restart(tmp_path):
    out = tmp_path / "out.jsonl"
    first = PartialOutput(out, SETTINGS, resume=False)
    first.write([{"id": 1}, {"id": 2}])
    first.close()
    with pytest.raises(OutputError, match="holds the 2 finished lines .* pass --resume .* or --restart"):
        PartialOutput(out, SETTINGS, resume=False)
    assert partial_path(out).read_text() == '{"id": 1}\n{"id": 2}\n'
    restarted = PartialOutput(out, SETTINGS, resume=False, restart=True)  # discards them
    assert restarted.done == set() and partial_path(out).read_bytes() == b""
    restarted.write([{"id": 3}])
    restarted.commit()
    assert out.read_text() == '{"id": 3}\n'


def test_a_failed_run_that_finished_no_line_leaves_nothing_in_the_way_of_the_retry(tmp_path):
    out = tmp_path / "out.jsonl"
    failed = PartialOutput(out, SETTINGS, resume=False)
    failed.close()
    assert "nothing was kept" in failed.kept()
    assert not partial_path(out).exists() and not settings_path(out).exists()
    # A partial file with no complete line (a kill before the first fsync) is not in the way either.
    partial_path(out).write_bytes(b'{"id": 1, "cand')
    PartialOutput(out, SETTINGS, resume=False).commit()
    assert out.read_text() == ""


@pytest.mark.parametrize("tail", [b'{"id": 3, "cand', b'{"id": 3, "cand\n', b"\x00\x00\x00\x00"])
def test_resume_drops_a_torn_last_line_with_or_without_its_newline(tmp_path, tail):
    out = tmp_path / "out.jsonl"
    first = PartialOutput(out, SETTINGS, resume=False)
    first.write([{"id": 1}, {"id": 2}])
    first.close()
    with open(partial_path(out), "ab") as fh:
        fh.write(tail)
    resumed = PartialOutput(out, SETTINGS, resume=True)
    assert resumed.done == {"1", "2"}
    resumed.write([{"id": 3}])
    resumed.commit()
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1, 2, 3]


def test_resume_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    first = PartialOutput(out, SETTINGS, resume=False)
    first.write([{"id": 1}])
    first.close()
    with pytest.raises(ResumeConfigError, match="generate: was False, now True.*--restart"):
        PartialOutput(out, {**SETTINGS, "generate": True}, resume=True)


def test_an_unwritable_output_is_a_one_line_error():
    with pytest.raises(OutputError, match="cannot"):
        PartialOutput(Path("/proc/fastscore_out.jsonl"), SETTINGS, resume=False)
    with pytest.raises(OutputError, match="cannot"):
        write_text_atomic(Path("/proc/fastscore_bench.json"), "{}")


def test_a_second_run_on_a_locked_folder_is_refused_naming_the_holder(tmp_path):
    folder = tmp_path / "run"
    with OutDirLock(folder):
        holder = json.loads((folder / HOLDER_FILE).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(OutputError, match=f"in use by another run \\(pid {os.getpid()}"):
            with OutDirLock(folder):
                pass
    with OutDirLock(folder):  # released: the next run may start
        pass
