"""The converted-model cache: directories keyed by content, verified before every load.

A model file converted for fast loading (a GGUF dequantized into a Hugging Face directory)
is cached at ``<cache>/models/<stem>-<sha256 of the file's bytes, 16 hex>``: every venv or
clone holding the same file finds the same conversion. A file's hash is remembered in
``<cache>/models/index.json`` under its path, inode, size, mtime and ctime, so a load
hashes it again only when the file changed.

A conversion is written to a temporary sibling with a manifest (``structgen-manifest.json``:
the source's hash, each file's size and sha256), then renamed into place. Before a load the
directory must match its manifest exactly (no file missing, added or changed; the same
source). One that does not (a foreign or half-written directory, a tampered file) is
converted again, or :class:`~structgen.errors.ModelCacheError` raised when it cannot be
replaced. A file's verification is remembered the same way as a hash, so an unchanged
directory is not read twice. The manifest catches corruption and stale or foreign
directories; whoever can write the cache can also write a manifest, so a cache shared with
untrusted users stays unsafe (give each user their own ``STRUCTGEN_CACHE``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from structgen.errors import ModelCacheError

__all__ = ["MANIFEST", "cache_root", "cached_conversion", "content_hash", "verify_dir", "write_manifest"]

MANIFEST = "structgen-manifest.json"
_FORMAT = 1
_CHUNK = 1 << 20
_lock = threading.Lock()  # the index file
_convert_lock = threading.Lock()  # one conversion at a time in a process; the others then find it


def cache_root() -> Path:
    """``$STRUCTGEN_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/structgen``."""
    if env := os.environ.get("STRUCTGEN_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "structgen"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _index_path() -> Path:
    return cache_root() / "models" / "index.json"


def _read_index() -> dict[str, Any]:
    try:
        data = json.loads(_index_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_index(index: dict[str, Any]) -> None:
    """Atomically (a concurrent writer may win; a lost entry is only hashed again)."""
    path = _index_path()
    index = {k: v for k, v in index.items() if k == "verified" or os.path.exists(k)}
    if isinstance(index.get("verified"), dict):
        index["verified"] = {k: v for k, v in index["verified"].items() if os.path.exists(k)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="index.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(index, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache still works; it hashes on every load


def content_hash(path: Path) -> str:
    """The sha256 of ``path``'s bytes, from the index when the file is unchanged."""
    path = path.resolve()
    key = _stat_key(path)
    with _lock:
        entry = _read_index().get(str(path))
        if isinstance(entry, dict) and entry.get("stat") == key and isinstance(entry.get("sha256"), str):
            return str(entry["sha256"])
    digest = _sha256_file(path)
    with _lock:
        index = _read_index()
        index[str(path)] = {"stat": key, "sha256": digest}
        _write_index(index)
    return digest


def _files(directory: Path) -> list[str]:
    """Every file under ``directory`` but the manifest, as sorted relative paths."""
    names = (str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())
    return sorted(name for name in names if name != MANIFEST)


def write_manifest(directory: Path, source_sha256: str) -> None:
    """Record each file's size and sha256, and the source's hash, in ``directory``."""
    files = {name: {"size": (directory / name).stat().st_size, "sha256": _sha256_file(directory / name)}
             for name in _files(directory)}
    manifest = {"format": _FORMAT, "source_sha256": source_sha256, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def verify_dir(directory: Path, source_sha256: str) -> str | None:
    """None when ``directory`` matches its manifest and comes from ``source_sha256``; else why not."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (not written by structgen's conversion, or not finished)"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({exc})"
    if not (isinstance(manifest, dict) and manifest.get("format") == _FORMAT
            and isinstance(manifest.get("files"), dict)):
        return "manifest of an unknown format"
    if manifest.get("source_sha256") != source_sha256:
        return "converted from another file"
    expected: dict[str, Any] = manifest["files"]
    present = _files(directory)
    if sorted(expected) != present:
        extra, missing = sorted(set(present) - set(expected)), sorted(set(expected) - set(present))
        return f"files differ from the manifest (unexpected: {extra}, missing: {missing})"
    with _lock:
        index = _read_index()
    verified = index.get("verified", {})
    verified = verified if isinstance(verified, dict) else {}
    changed = False
    for name in present:
        path = directory / name
        want = expected[name]
        if not isinstance(want, dict) or path.stat().st_size != want.get("size"):
            return f"{name}: size differs from the manifest"
        key, record = str(path.resolve()), [*_stat_key(path), want.get("sha256")]
        if verified.get(key) == record:
            continue  # hashed before, unchanged since (inode, size, mtime and ctime)
        if _sha256_file(path) != want.get("sha256"):
            return f"{name}: content differs from the manifest"
        verified[key] = record
        changed = True
    if changed:
        with _lock:
            index = _read_index()
            index["verified"] = {**(index.get("verified") or {}), **verified}
            _write_index(index)
    return None


def _discard(directory: Path, why: str) -> None:
    """Move a directory that failed verification out of the way (then delete it)."""
    aside = directory.with_name(f"{directory.name}.discarded-{os.getpid()}-{threading.get_ident()}")
    try:
        directory.rename(aside)
    except FileNotFoundError:
        return  # another process replaced it already
    except OSError as exc:
        raise ModelCacheError(
            f"the cached model at {directory} does not match its manifest ({why}) and cannot be replaced "
            f"({exc}); remove it, or set STRUCTGEN_CACHE to a directory of your own", backend="embedded") from exc
    shutil.rmtree(aside, ignore_errors=True)


def cached_conversion(source: Path, convert: Callable[[Path], None], *, label: str | None = None,
                      seconds: str = "~40 s") -> Path:
    """The verified cache directory for ``source``, converted by ``convert(tmp_dir)`` if needed.

    ``convert`` writes the converted files into the (empty, temporary) directory it is given.
    The first conversion prints one line to stderr, as it takes a while.
    """
    sha = content_hash(source)
    out = cache_root() / "models" / f"{source.stem}-{sha[:16]}"
    with _convert_lock:
        return _convert_once(source, sha, out, convert, label or source.stem, seconds)


def _convert_once(source: Path, sha: str, out: Path, convert: Callable[[Path], None], label: str,
                  seconds: str) -> Path:
    if out.exists():
        why = verify_dir(out, sha)
        if why is None:
            return out
        print(f"structgen: the cached model at {out} failed verification ({why}); converting it again",
              file=sys.stderr, flush=True)
        _discard(out, why)
    print(f"structgen: converting {label} once into {out}, {seconds}", file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    try:
        convert(tmp)
        write_manifest(tmp, sha)
        try:
            tmp.rename(out)
        except OSError:
            if not out.is_dir():
                raise  # not a concurrent writer's finished copy: a real failure
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    why = verify_dir(out, sha)  # ours, or a concurrent writer's that won the rename
    if why is not None:
        raise ModelCacheError(f"the cached model at {out} failed verification right after conversion ({why})",
                              backend="embedded")
    return out
