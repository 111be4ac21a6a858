"""The converted-model cache (backends/embedded/model_cache.py): keyed by content, hashed once
per file version, verified against its manifest before every load (issue 13 item 14).

The cache logic runs on real files with a small converter here (the real GGUF conversion
takes ~40 s); the last test checks the real default model's cached conversion.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from structgen.backends.embedded import model_cache
from structgen.backends.embedded.model_cache import MANIFEST, cached_conversion, content_hash, verify_dir
from structgen.errors import BackendError, ModelCacheError


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


class Converter:
    """Writes a small 'converted model' (config, weights, tokenizer in a subfolder); counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, out: Path) -> None:
        self.calls += 1
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        (out / "tok").mkdir()
        (out / "tok" / "tokenizer.json").write_text("{}")


@pytest.fixture
def counted_hashes(monkeypatch) -> list[Path]:
    """Every file the cache hashes, in order."""
    seen: list[Path] = []
    real = model_cache._sha256_file

    def counting(path: Path) -> str:
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(model_cache, "_sha256_file", counting)
    return seen


def _source(tmp_path: Path, name: str = "model.gguf", data: bytes = b"GGUF weights v1") -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_the_cache_root_follows_structgen_cache_then_xdg(monkeypatch, tmp_path):
    assert model_cache.cache_root() == tmp_path / "cache"
    monkeypatch.delenv("STRUCTGEN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.cache_root() == tmp_path / "xdg" / "structgen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_cache.cache_root() == Path.home() / ".cache" / "structgen"


def test_the_same_file_at_two_paths_is_converted_once_and_says_so(tmp_path, capsys):
    convert = Converter()
    a = _source(tmp_path, "a/model.gguf")
    b = _source(tmp_path / "other-venv", "a/model.gguf")  # another venv, same bytes
    out_a = cached_conversion(a, convert, label="TinyModel")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"converting TinyModel once into {out_a}, ~40 s" in err
    out_b = cached_conversion(b, convert, label="TinyModel")
    assert out_a == out_b and convert.calls == 1
    assert capsys.readouterr().err == ""  # a cache hit prints nothing
    assert out_a.name == f"model-{content_hash(a)[:16]}"


def test_different_content_gets_its_own_directory(tmp_path):
    convert = Converter()
    one = cached_conversion(_source(tmp_path, "x/model.gguf", b"one"), convert)
    two = cached_conversion(_source(tmp_path, "y/model.gguf", b"two"), convert)
    assert one != two and convert.calls == 2


def test_a_files_hash_is_computed_once_per_version_of_the_file(tmp_path, counted_hashes):
    src = _source(tmp_path)
    first = content_hash(src)
    assert content_hash(src) == first and counted_hashes == [src.resolve()]
    src.write_bytes(b"GGUF weights v2")  # changed content: hashed again
    assert content_hash(src) != first and len(counted_hashes) == 2


def test_an_unchanged_cache_hit_reads_no_file_again(tmp_path, counted_hashes):
    convert = Converter()
    src = _source(tmp_path)
    out = cached_conversion(src, convert)
    n = len(counted_hashes)  # the source, the manifest's files, their first verification
    assert cached_conversion(src, convert) == out
    assert len(counted_hashes) == n and convert.calls == 1


def test_the_manifest_records_every_file_and_the_source(tmp_path):
    src = _source(tmp_path)
    out = cached_conversion(src, Converter())
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["source_sha256"] == content_hash(src)
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "tok/tokenizer.json"]
    assert manifest["files"]["model.safetensors"]["size"] == 256 * 64
    assert verify_dir(out, content_hash(src)) is None


@pytest.mark.parametrize(("tamper", "why"), [
    (lambda out: (out / "model.safetensors").write_bytes(b"\xff" * (256 * 64)), "content differs"),  # same size
    (lambda out: (out / "config.json").write_text('{"model_type": "evil"}'), "size differs"),
    (lambda out: (out / "extra.py").write_text("import os"), "unexpected: ['extra.py']"),
    (lambda out: (out / "tok" / "tokenizer.json").unlink(), "missing: ['tok/tokenizer.json']"),
    (lambda out: (out / MANIFEST).unlink(), "no manifest"),
    (lambda out: (out / MANIFEST).write_text("{not json"), "unreadable manifest"),
])
def test_a_tampered_directory_is_detected_and_converted_again(tmp_path, capsys, tamper, why):
    convert = Converter()
    src = _source(tmp_path)
    out = cached_conversion(src, convert)
    tamper(out)
    assert why in (verify_dir(out, content_hash(src)) or "")
    capsys.readouterr()
    assert cached_conversion(src, convert) == out and convert.calls == 2
    err = capsys.readouterr().err
    assert "failed verification" in err and why in err and "converting" in err
    assert verify_dir(out, content_hash(src)) is None
    assert (out / "model.safetensors").read_bytes() == bytes(range(256)) * 64
    assert not list(out.parent.glob("*.discarded-*"))  # the bad copy is gone


def test_a_directory_planted_at_the_predictable_path_is_not_loaded(tmp_path, cache):
    src = _source(tmp_path)
    planted = cache / "models" / f"model-{content_hash(src)[:16]}"
    planted.mkdir(parents=True)
    (planted / "config.json").write_text('{"model_type": "planted"}')
    convert = Converter()
    assert cached_conversion(src, convert) == planted and convert.calls == 1
    assert json.loads((planted / "config.json").read_text()) == {"model_type": "llama"}


def test_a_manifest_from_another_source_is_refused(tmp_path):
    convert = Converter()
    src, other = _source(tmp_path, "a.gguf", b"A"), _source(tmp_path, "b.gguf", b"B")
    out, out_other = cached_conversion(src, convert), cached_conversion(other, convert)
    shutil.copy(out_other / MANIFEST, out / MANIFEST)  # a consistent manifest, of another file
    assert verify_dir(out, content_hash(src)) == "converted from another file"


def test_a_bad_directory_that_cannot_be_replaced_raises_a_typed_error(tmp_path, monkeypatch):
    src = _source(tmp_path)
    out = cached_conversion(src, Converter())
    (out / "config.json").write_text('{"model_type": "evil!"}')

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "rename", refuse)  # as in a cache directory of another user
    with pytest.raises(ModelCacheError, match="does not match its manifest") as info:
        cached_conversion(src, Converter())
    assert isinstance(info.value, BackendError) and "STRUCTGEN_CACHE" in str(info.value)


@pytest.mark.model
def test_the_default_models_conversion_is_verified():
    from structgen.backends.embedded.loader import default_gguf_path, resolve_model_dir

    out = Path(resolve_model_dir())
    gguf = default_gguf_path()
    assert out.name == f"{gguf.stem}-{content_hash(gguf)[:16]}"
    assert verify_dir(out, content_hash(gguf)) is None
    assert "model.safetensors" in json.loads((out / MANIFEST).read_text())["files"]
