"""Install llama.cpp's own HTTP server (``llama-server``) without compiling and without root.

    python backends/llamacpp/install_server.py DEST [--suite sid] [--mirror URL] [--packages FILE]

llama.cpp publishes no server on PyPI, and compiling it (or llama-cpp-python) takes 15-60
minutes on two cores. Debian builds it (``llama.cpp-tools``: ``llama-server``, with
``libllama0`` and ``libggml0``, whose CPU backends come in one build per x86 level and are
picked at start-up), but in its newest suites only, for a newer C library than older
distributions carry. This script fetches the ``.deb`` files pinned in
``server-packages.txt`` (next to it) - the server, its libraries, and the C/C++ runtime they
were built for - and unpacks them under ``DEST/root``; ``DEST/bin/llama-server`` runs the
server through the unpacked C library's own loader, so it runs on any x86-64 Linux whatever
its C library (Debian 12's glibc 2.36 included).

Integrity: the suite's ``InRelease`` is checked with ``gpgv`` against Debian's archive
keyring when both are on the machine (else HTTPS alone, and it says so); the
``Packages.xz`` index against ``InRelease``'s SHA-256, and each ``.deb`` against the index's.
A pinned version the mirror no longer carries (Debian's development suites move) is replaced
by the one it carries, loudly. Nothing is fetched but the suite's index and those packages.

Standard library only: the tests' engine installer (``tests/servers/install_engines.sh
llamacpp``) runs it with any ``python3``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import platform
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = HERE / "server-packages.txt"
MIRROR = "https://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
LIBDIR = "usr/lib/x86_64-linux-gnu"

WRAPPER = """#!/bin/sh
# llama.cpp's llama-server, as Debian built it, run by the C library it was built for
# (written by structgen's backends/llamacpp/install_server.py; packages: {pins})
here=$(cd "$(dirname "$0")/.." && pwd)
lib="$here/root/{libdir}"
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:$lib/llama:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" \\
  "$here/root/usr/bin/llama-server" "$@"
"""


def say(msg: str) -> None:
    print(f"[llama-server] {msg}", flush=True)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        data: bytes = r.read()
    return data


def read_pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("=")
            pins[name.strip()] = version.strip()
    return pins


def verified_index(mirror: str, suite: str) -> dict[str, dict[str, str]]:
    """Package name -> its stanza in the suite's main/binary-amd64 index, checked as far as
    this machine allows (see the module's docstring)."""
    release = fetch(f"{mirror}/dists/{suite}/InRelease")
    gpgv = shutil.which("gpgv")
    if gpgv and KEYRING.is_file():
        with tempfile.NamedTemporaryFile(suffix=".InRelease") as f:
            f.write(release)
            f.flush()
            check = subprocess.run([gpgv, "--keyring", str(KEYRING), f.name], check=False,
                                   capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"{suite}'s InRelease fails gpgv against {KEYRING}:\n{check.stderr}")
        say(f"{suite} InRelease: good signature ({KEYRING.name})")
    else:
        say(f"{suite} InRelease: gpgv or {KEYRING} missing here; trusting HTTPS alone")
    member = "main/binary-amd64/Packages.xz"
    m = re.search(rf"^ ([0-9a-f]{{64}})\s+\d+\s+{re.escape(member)}$", release.decode(), re.M)
    if not m:
        raise SystemExit(f"{suite}'s InRelease lists no SHA-256 for {member}")
    packed = fetch(f"{mirror}/dists/{suite}/{member}")
    if hashlib.sha256(packed).hexdigest() != m.group(1):
        raise SystemExit(f"{member} does not match {suite}'s InRelease")
    index: dict[str, dict[str, str]] = {}
    for block in lzma.decompress(packed).decode().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", block, re.M))
        if "Package" in fields:
            index.setdefault(fields["Package"], fields)
    return index


def ar_member(deb: bytes, prefix: str) -> tuple[str, bytes]:
    """The first member of a ``.deb`` (an ``ar`` archive) whose name starts with prefix."""
    if not deb.startswith(b"!<arch>\n"):
        raise SystemExit("not a .deb (ar) archive")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith(prefix):
            return name, body
        pos += 60 + size + (size & 1)
    raise SystemExit(f"the .deb has no {prefix}* member")


def unpack(deb: bytes, dest: Path) -> None:
    name, data = ar_member(deb, "data.tar")
    if not name.endswith((".xz", ".gz", ".tar")):
        raise SystemExit(f"cannot unpack {name} with the standard library")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        # the "tar" filter refuses members and links that leave dest (Python >= 3.11.4)
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(dest, filter="tar")
        else:
            for member in tar.getmembers():
                target = (dest / member.name).resolve()
                if member.name.startswith("/") or dest.resolve() not in (target, *target.parents):
                    raise SystemExit(f"refusing {member.name}: outside {dest}")
            tar.extractall(dest)  # every member checked above


def install(dest: Path, *, suite: str, mirror: str, packages: Path) -> None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit(f"Debian's amd64 build runs on x86-64 Linux, not {platform.system()} {platform.machine()}")
    pins = read_pins(packages)
    index = verified_index(mirror, suite)
    work = dest.with_name(dest.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    root.mkdir(parents=True)
    used: list[str] = []
    for name, pinned in pins.items():
        stanza = index.get(name)
        if stanza is None:
            raise SystemExit(f"{suite} has no package {name}")
        version = stanza["Version"]
        if version != pinned:
            say(f"WARNING: {name} {pinned} is pinned but {suite} now carries {version}; taking {version}")
        deb = fetch(f"{mirror}/{stanza['Filename']}")
        if hashlib.sha256(deb).hexdigest() != stanza["SHA256"]:
            raise SystemExit(f"{stanza['Filename']} does not match {suite}'s index")
        unpack(deb, root)
        used.append(f"{name}={version}")
        say(f"{name} {version} ({len(deb) / 1e6:.1f} MB)")
    lib = root / LIBDIR
    # run through ld.so, the server's "executable directory" is the loader's: ggml looks
    # there for its CPU backends (one per x86 level) and loads the best one for this CPU
    for backend in (lib / "ggml" / "backends0").glob("libggml-cpu-*.so"):
        shutil.copy2(backend, lib / backend.name)
    (work / "bin").mkdir()
    wrapper = work / "bin" / "llama-server"
    wrapper.write_text(WRAPPER.format(pins=" ".join(used), libdir=LIBDIR))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    check = subprocess.run([str(wrapper), "--version"], check=False, capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        raise SystemExit(f"the unpacked llama-server does not start:\n{check.stdout}{check.stderr}")
    version = (check.stdout + check.stderr).strip().splitlines()[0]
    shutil.copy2(packages, work / "server-packages.txt")  # what was asked for: the installer's "present" check
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(work, dest)
    say(f"{dest / 'bin' / 'llama-server'}: {version}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path, help="folder to install into (replaced when the install succeeds)")
    ap.add_argument("--suite", default="sid", help="Debian suite (default: sid)")
    ap.add_argument("--mirror", default=MIRROR, help=f"Debian mirror (default: {MIRROR})")
    ap.add_argument("--packages", type=Path, default=PACKAGES, help="name=version pins (default: server-packages.txt)")
    args = ap.parse_args()
    install(args.dest.resolve(), suite=args.suite, mirror=args.mirror.rstrip("/"), packages=args.packages)


if __name__ == "__main__":
    main()
