"""backends/llamacpp/install_server.py: the pins, the ``.deb`` reader and the unpacking, on
archives built here (the live download is exercised by the engine installer in CI, and the
installed server by tests/backends/test_llamacpp.py)."""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("install_server", ROOT / "backends/llamacpp/install_server.py")
assert spec is not None and spec.loader is not None
inst = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inst)


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, body in members:
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode()
        assert len(header) == 60
        out += header + body + (b"\n" if len(body) % 2 else b"")
    return bytes(out)


def _tar_xz(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(body), 0o755
            tar.addfile(info, io.BytesIO(body))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def test_the_pins_name_the_server_its_libraries_and_the_c_runtime():
    pins = inst.read_pins(inst.PACKAGES)
    assert {"llama.cpp-tools", "libllama0", "libggml0", "libc6", "libstdc++6"} <= set(pins)
    assert all(v and not v.startswith("=") for v in pins.values()), pins


def test_read_pins_skips_comments_and_blank_lines(tmp_path):
    f = tmp_path / "pins.txt"
    f.write_text("# header\n\nliba=1.0-1  # trailing\n libb = 2:3.4 \n")
    assert inst.read_pins(f) == {"liba": "1.0-1", "libb": "2:3.4"}


def test_ar_member_walks_past_odd_sized_members():
    deb = _ar([("debian-binary", b"2.0\n"), ("control.tar.xz", b"abc"), ("data.tar.xz", b"payload")])
    assert inst.ar_member(deb, "data.tar") == ("data.tar.xz", b"payload")
    assert inst.ar_member(deb, "control") == ("control.tar.xz", b"abc")
    with pytest.raises(SystemExit, match=r"no data\.tar"):
        inst.ar_member(_ar([("debian-binary", b"2.0\n")]), "data.tar")
    with pytest.raises(SystemExit, match=r"not a \.deb"):
        inst.ar_member(b"PK\x03\x04 a zip", "data.tar")


def test_unpack_extracts_the_data_member(tmp_path):
    deb = _ar([("debian-binary", b"2.0\n"), ("data.tar.xz", _tar_xz({"./usr/bin/tool": b"#!/bin/sh\n"},
                                                                     {"./usr/bin/alias": "tool"}))])
    inst.unpack(deb, tmp_path)
    tool = tmp_path / "usr" / "bin" / "tool"
    assert tool.read_bytes() == b"#!/bin/sh\n" and tool.stat().st_mode & 0o100
    assert (tmp_path / "usr" / "bin" / "alias").resolve() == tool.resolve()


def test_unpack_refuses_a_member_leaving_the_folder(tmp_path):
    deb = _ar([("data.tar.xz", _tar_xz({"../escape": b"x"}))])
    with pytest.raises(Exception, match=r"outside|escape"):
        inst.unpack(deb, tmp_path / "dest")
    assert not (tmp_path / "escape").exists()


def test_engine_installer_dry_run_names_the_llama_server_installer(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHON": sys.executable, "STRUCTGEN_ENGINES": str(tmp_path / "engines")}
    out = subprocess.run(["bash", "tests/servers/install_engines.sh", "--dry-run", "llamacpp"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("[llamacpp]"))
    assert f"backends/llamacpp/install_server.py {tmp_path}/engines/llamacpp" in line
    assert not (tmp_path / "engines").exists()
