"""The artefact cache verifies what it serves. Every corruption is made on a copy of a tiny model's variants in the
test's own FASTSCORE_HOME, never in the shared cache: a zeroed GGUF tail, NaN weights, a broken tokenizer, truncated
fp32 weights, one byte flipped in place with the file's mtime put back. Each ends in a one-line error (exit 4) naming
the artefact and the command that rebuilds it, and that command works."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fastscore import cache
from fastscore.cli import main

REQUEST = {"id": "r", "messages": [{"role": "user", "content": "Say hi"}], "candidates": ["Hi there", "Hello"]}


# ---------------------------------------------------------------- the marker, without any model


def test_a_variant_is_sealed_with_versions_and_file_records(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTSCORE_HOME", str(tmp_path))
    final = cache.variant_dir("m", "gguf-f32")
    with cache.atomic_dir(final) as scratch:
        (scratch / "model.gguf").write_bytes(bytes(range(256)) * 40_000)
    marker = json.loads((final / cache.COMPLETE_MARKER).read_text())
    assert marker["format"] == cache.FORMAT_VERSION
    assert set(marker["built_with"]) >= {"fastscore", "llama_cpp_python", "gguf"}
    assert marker["files"]["model.gguf"]["size"] == 10_240_000
    assert cache.is_complete(final) and cache.check_files(final, full=True) == []
    for path in (final, final / "model.gguf"):  # a shared lab cache: the group can read it
        assert path.stat().st_mode & stat.S_IRGRP


def test_a_variant_built_by_other_versions_or_an_older_fastscore_counts_as_missing(tmp_path):
    final = tmp_path / "gguf-q8_0"
    with cache.atomic_dir(final) as scratch:
        (scratch / "model.gguf").write_bytes(b"x" * 100)
    marker = json.loads((final / cache.COMPLETE_MARKER).read_text())
    marker["built_with"]["llama_cpp_python"] = "0.0.1"
    (final / cache.COMPLETE_MARKER).write_text(json.dumps(marker))
    assert not cache.is_complete(final)
    assert "llama_cpp_python 0.0.1 ->" in cache.stale_reason(final)
    (final / cache.COMPLETE_MARKER).write_text("ok\n")  # the marker of the code before versioning
    assert not cache.is_complete(final) and "older fastscore" in cache.stale_reason(final)


@pytest.mark.parametrize("damage", ["truncate", "zero tail", "flip a middle byte"])
def test_every_damage_is_caught_by_the_check_made_on_each_load(tmp_path, damage):
    final = tmp_path / "gguf-f32"
    with cache.atomic_dir(final) as scratch:
        (scratch / "model.gguf").write_bytes(np.random.default_rng(0).bytes(8 << 20))
    path = final / "model.gguf"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[-4:]
    elif damage == "zero tail":
        data[-(2 << 20):] = bytes(2 << 20)
    else:
        data[(3 << 20) + 12345] ^= 0xFF  # between the sampled blocks: the fingerprint misses it, the hash does not
    path.write_bytes(bytes(data))
    quick, full = cache.check_files(final), cache.check_files(final, full=True)
    print(damage, quick, full)
    assert quick and full


def _flip_middle_byte(path: Path) -> None:
    """One byte between the fingerprint's sampled blocks, in place: the size and the inode stay."""
    before = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(before.st_size // 2 + 777)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    after = path.stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)


@pytest.fixture
def counted_hashes(monkeypatch):
    """The files cache.sha256 reads, in order (the real hash, instrumented)."""
    read, real = [], cache.sha256

    def counting(path):
        read.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(cache, "sha256", counting)
    return read


def test_an_unchanged_file_is_hashed_once_and_a_flipped_byte_with_its_mtime_restored_is_caught(tmp_path,
                                                                                            counted_hashes):
    final = tmp_path / "gguf-f32"
    with cache.atomic_dir(final) as scratch:
        (scratch / "model.gguf").write_bytes(np.random.default_rng(1).bytes(8 << 20))
    path = final / "model.gguf"
    sealed = len(counted_hashes)
    assert cache.check_files(final) == [] and len(counted_hashes) == sealed  # stamped at sealing: a stat, no hash
    before = path.stat()
    _flip_middle_byte(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # size, inode and mtime as verified: ctime moved
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    problems = cache.check_files(final)
    print(problems)
    assert [p.what for p in problems] == ["SHA-256 differs from what was built"]
    assert counted_hashes[sealed:] == ["model.gguf"]


def test_a_marker_edited_by_hand_is_checked_against_the_file_not_vouched_for_by_the_stamp(tmp_path, counted_hashes):
    final = tmp_path / "gguf-f32"
    with cache.atomic_dir(final) as scratch:
        (scratch / "model.gguf").write_bytes(np.random.default_rng(3).bytes(1 << 20))
    marker_file = final / cache.COMPLETE_MARKER
    marker = json.loads(marker_file.read_text())
    marker["files"]["model.gguf"]["sha256"] = "0" * 64  # the file is untouched; its recorded hash is not
    marker_file.write_text(json.dumps(marker))
    n = len(counted_hashes)
    problems = cache.check_files(final)
    print(problems)
    assert [p.what for p in problems] == ["SHA-256 differs from what was built"] and len(counted_hashes) == n + 1


def test_a_damaged_copy_put_in_place_with_the_same_size_and_mtime_is_caught(tmp_path, counted_hashes):
    final = tmp_path / "gguf-f32"
    with cache.atomic_dir(final) as scratch:
        (scratch / "model.gguf").write_bytes(np.random.default_rng(2).bytes(8 << 20))
    path, copy = final / "model.gguf", tmp_path / "copy.gguf"
    shutil.copy2(path, copy)  # copy2 keeps the mtime
    _flip_middle_byte(copy)
    os.utime(copy, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    os.replace(copy, path)  # a new inode under the old name
    problems = cache.check_files(final)
    print(problems)
    assert [p.what for p in problems] == ["SHA-256 differs from what was built"]
    # Once repaired (the bytes put back), the new file is hashed once, stamped, and then served on a stat.
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 777] ^= 0xFF
    path.write_bytes(bytes(data))
    n = len(counted_hashes)
    assert cache.check_files(final) == [] and cache.check_files(final) == []
    assert len(counted_hashes) == n + 1


# ---------------------------------------------------------------- the CLI on a damaged copy of a tiny model


@pytest.fixture
def tiny_copy(tiny_artefact, tmp_path, monkeypatch):
    """The tiny llama's variants (tokenizer, hf-fp32, gguf-f32) copied into this test's own FASTSCORE_HOME."""
    artefact = tiny_artefact("llama", "llamacpp", "f32")
    key_dir = Path(artefact.path).parent.parent
    home = tmp_path / "home"
    shutil.copytree(key_dir, home / key_dir.name, ignore=shutil.ignore_patterns(".lock-*", ".tmp-*"))
    monkeypatch.setenv("FASTSCORE_HOME", str(home))
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps(REQUEST) + "\n")
    model = str(artefact.model)
    return model, home / key_dir.name, requests


def _score(model, requests, out, *extra):
    result = CliRunner().invoke(main, ["score", str(requests), "--model", model, "--quant", "f32", "--threads", "2",
                                       "--out", str(out), *extra])
    print(result.output)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _damaged(result, *names):
    assert result.exit_code == 4
    [line] = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert "damaged" in line and all(name in line for name in names)
    return line


def test_a_zeroed_gguf_tail_is_refused_and_the_named_fix_repairs_it(tiny_copy, tmp_path):
    model, variants, requests = tiny_copy
    good = _score(model, requests, tmp_path / "good.jsonl")
    assert good.exit_code == 0
    gguf = variants / "gguf-f32" / "model.gguf"
    with open(gguf, "r+b") as fh:
        size = fh.seek(0, 2)
        fh.seek(size // 2)
        fh.write(bytes(size - size // 2))
    line = _damaged(_score(model, requests, tmp_path / "bad.jsonl"), "gguf-f32", "--force")
    fix = line.split("rebuild it with: ")[1].split()
    assert fix[:2] == ["fastscore", "convert"]
    repaired = CliRunner().invoke(main, fix[1:])
    print(repaired.output)
    assert repaired.exit_code == 0
    again = _score(model, requests, tmp_path / "again.jsonl")
    assert again.exit_code == 0
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "good.jsonl").read_text()


def test_nan_weights_are_a_one_line_error_naming_the_file(tiny_copy, tmp_path):
    gguf_lib = pytest.importorskip("gguf")
    model, variants, requests = tiny_copy
    folder = variants / "gguf-f32"
    reader = gguf_lib.GGUFReader(str(folder / "model.gguf"))
    tensor = next(t for t in reader.tensors if t.name.endswith("attn_q.weight"))
    offset, n_bytes = int(tensor.data_offset), int(tensor.n_bytes)
    del reader
    with open(folder / "model.gguf", "r+b") as fh:  # NaN as built (e.g. a converter bug): re-sealed as valid
        fh.seek(offset)
        fh.write(np.full(n_bytes // 4, np.nan, dtype=np.float32).tobytes())
    cache.seal(folder, folder.name)
    _damaged(_score(model, requests, tmp_path / "out.jsonl"), str(folder / "model.gguf"), "non-finite",
             "--gguf f32 --force")


def test_a_truncated_tokenizer_json_is_refused(tiny_copy, tmp_path):
    model, variants, requests = tiny_copy
    path = variants / "tokenizer" / "tokenizer.json"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    _damaged(_score(model, requests, tmp_path / "out.jsonl"), "'tokenizer'", "fastscore convert")


def test_an_unparsable_tokenizer_config_is_a_one_line_error_with_the_fix(tiny_copy, tmp_path):
    model, variants, requests = tiny_copy
    folder = variants / "tokenizer"
    (folder / "tokenizer_config.json").write_text("{not json")
    cache.seal(folder, folder.name)  # damaged before it was sealed: only the loader can tell
    line = _damaged(_score(model, requests, tmp_path / "out.jsonl"), "tokenizer_config.json", "--force")
    assert "rebuild it with: fastscore convert" in line


def test_truncated_fp32_weights_are_refused_by_the_reference_backend(tiny_copy, tmp_path):
    model, variants, requests = tiny_copy
    weights = variants / "hf-fp32" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = CliRunner().invoke(main, ["score", str(requests), "--model", model, "--backend", "reference",
                                       "--out", str(tmp_path / "out.jsonl")])
    print(result.output)
    assert "Traceback" not in result.output
    _damaged(result, "hf-fp32", "model.safetensors")


def test_a_flipped_byte_in_a_cached_gguf_is_refused_before_scoring_even_with_its_mtime_restored(tiny_copy, tmp_path):
    model, variants, requests = tiny_copy
    assert _score(model, requests, tmp_path / "good.jsonl").exit_code == 0  # stamps the copy's new inodes
    gguf = variants / "gguf-f32" / "model.gguf"
    before = gguf.stat()
    _flip_middle_byte(gguf)
    os.utime(gguf, ns=(before.st_atime_ns, before.st_mtime_ns))
    _damaged(_score(model, requests, tmp_path / "bad.jsonl"), "gguf-f32", "SHA-256", "--force")
    assert not (tmp_path / "bad.jsonl").exists()  # nothing was scored


def test_models_verify_finds_what_sampling_misses(tiny_copy):
    model, variants, _ = tiny_copy
    ok = CliRunner().invoke(main, ["models", "verify", model])
    print(ok.output)
    assert ok.exit_code == 0 and "0 damaged" in ok.output
    gguf = variants / "gguf-f32" / "model.gguf"
    _flip_middle_byte(gguf)
    bad = CliRunner().invoke(main, ["models", "verify", model])
    print(bad.output)
    assert bad.exit_code == 4 and "gguf-f32" in bad.output and "SHA-256 differs" in bad.output
