"""Reuse a built ``dynamo._core`` across runs and checkouts (used by ``scripts/_env.sh``).

Cargo decides what to rebuild from file modification times, so a second checkout of the
same sources (another clone, a CI run's fresh clone) recompiles every workspace crate even
though the shared target directory already holds them. This helper keys a build by what
went into it instead: the contents of every file of the Rust workspace and of
``pyproject.toml``, the compiler's and maturin's versions and the build arguments. After a
build the extension (and the editable install's metadata) is stored under that key in the
cargo target directory; a later run with the same key installs it in a second instead of
building.

Commands (``python scripts/_extension.py ...``, run with the venv's Python):

* ``key ROOT ARGS...``: print the build key of the checkout at ROOT;
* ``restore ROOT CACHE KEY``: exit 0 if the extension of KEY is installed in this venv for
  ROOT (already, or now from CACHE), 1 if it must be built;
* ``store ROOT CACHE KEY``: save the extension just built and its install metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# What a build depends on, relative to the checkout (directories are walked).
INPUTS = ["crates", "Cargo.toml", "Cargo.lock", "pyproject.toml", ".cargo", "rust-toolchain.toml"]
EXT = "_core.abi3.so"
DIST = "dynamo_rs"
KEEP = 6  # cached builds kept (each ~60 MB)


def _files(root: Path) -> list[Path]:
    """The input files: git's view (tracked and untracked, ignored ones left out) when the
    checkout is a repository, else every file under the inputs but build outputs."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard", "--", *INPUTS],
            capture_output=True,
            check=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(root))
            for top in INPUTS
            for p in ([root / top] if (root / top).is_file() else (root / top).rglob("*"))
            if p.is_file() and "target" not in p.parts
        ]
    return sorted(root / n for n in set(names) if (root / n).is_file())


def key(root: Path, args: list[str]) -> str:
    h = hashlib.sha256()
    for cmd in (["rustc", "-vV"], [sys.executable, "-m", "maturin", "--version"]):
        try:
            h.update(subprocess.run(cmd, capture_output=True).stdout)
        except OSError:
            h.update(b"missing " + cmd[0].encode())
    h.update(json.dumps(args).encode())
    h.update(os.environ.get("RUSTFLAGS", "").encode())
    for f in _files(root):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _installed_for(root: Path) -> bool:
    """Whether this venv imports ``dynamo`` from ROOT's ``python/`` (the editable install)."""
    pth = _site() / f"{DIST}.pth"
    return pth.is_file() and pth.read_text().strip() == str(root / "python")


def _stamp(root: Path) -> Path:
    return root / "python" / "dynamo" / f".{EXT}.key"


def _stamp_text(ext: Path, build_key: str) -> str:
    """The key, and the file it was written for: a `maturin develop` run by hand replaces
    the file, and the stamp then no longer vouches for it."""
    st = ext.stat()
    return f"{build_key} {st.st_size} {st.st_mtime_ns}"


def restore(root: Path, cache: Path, build_key: str) -> int:
    ext = root / "python" / "dynamo" / EXT
    stamp = _stamp(root)
    if (
        _installed_for(root)
        and ext.is_file()
        and stamp.is_file()
        and stamp.read_text() == _stamp_text(ext, build_key)
    ):
        return 0
    entry = cache / build_key
    if not (entry / EXT).is_file():
        return 1
    site = _site()
    if not _installed_for(root):
        # The editable install maturin would write: the dist-info (so pip lists and can
        # uninstall it) and a .pth that puts ROOT/python on sys.path.
        for old in site.glob(f"{DIST}-*.dist-info"):
            shutil.rmtree(old)
        for info in entry.glob(f"{DIST}-*.dist-info"):
            shutil.copytree(info, site / info.name)
            (site / info.name / "direct_url.json").write_text(
                json.dumps({"dir_info": {"editable": True}, "url": root.as_uri()})
            )
        (site / f"{DIST}.pth").write_text(str(root / "python"))
    tmp = ext.with_suffix(".tmp")
    shutil.copyfile(entry / EXT, tmp)
    os.replace(tmp, ext)
    stamp.write_text(_stamp_text(ext, build_key))
    os.utime(entry)  # most recently used
    return 0


def store(root: Path, cache: Path, build_key: str) -> int:
    entry = cache / build_key
    tmp = cache / f".{build_key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(root / "python" / "dynamo" / EXT, tmp / EXT)
    for info in _site().glob(f"{DIST}-*.dist-info"):
        shutil.copytree(info, tmp / info.name)
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(tmp, entry)
    ext = root / "python" / "dynamo" / EXT
    _stamp(root).write_text(_stamp_text(ext, build_key))
    entries = sorted(
        (p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    command, root = argv[0], Path(argv[1]).resolve()
    if command == "key":
        print(key(root, argv[2:]))
        return 0
    cache, build_key = Path(argv[2]), argv[3]
    return {"restore": restore, "store": store}[command](root, cache, build_key)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
