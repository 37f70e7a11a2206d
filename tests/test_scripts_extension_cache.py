"""``scripts/_extension.py``: the build cache that makes a re-run of ``scripts/run.sh`` take
seconds in any checkout of the same sources (issue 54, item 8).

Checked on small fake checkouts and throw-away virtual environments: the key follows the
files' contents (not their paths or modification times), and a build stored from one
checkout is installed into another checkout's fresh venv as an editable install of that
other checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "_extension.py"


def _checkout(root: Path) -> Path:
    (root / "crates" / "a" / "src").mkdir(parents=True)
    (root / "crates" / "a" / "src" / "lib.rs").write_text("pub fn f() {}\n")
    (root / "Cargo.toml").write_text("[workspace]\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "python" / "dynamo").mkdir(parents=True)
    return root


def _run(python: Path | str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True)


def _key(root: Path) -> str:
    out = _run(sys.executable, "key", str(root), "--release")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_key_follows_contents_not_paths_or_times(tmp_path) -> None:
    a = _checkout(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    os.utime(b / "crates" / "a" / "src" / "lib.rs", (1, 1))
    assert _key(a) == _key(b)
    (b / "crates" / "a" / "src" / "lib.rs").write_text("pub fn g() {}\n")
    assert _key(a) != _key(b)
    (b / "crates" / "a" / "src" / "lib.rs").write_text("pub fn f() {}\n")
    assert _key(a) == _key(b)
    # Build arguments (features) are part of it.
    out = _run(sys.executable, "key", str(a), "--release", "--features", "x")
    assert out.stdout.strip() != _key(a)


def _venv(path: Path) -> tuple[Path, Path]:
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return python, Path(site)


def test_a_build_stored_from_one_checkout_installs_into_another(tmp_path) -> None:
    cache = tmp_path / "cache"
    a = _checkout(tmp_path / "a")
    py_a, site_a = _venv(tmp_path / "venv-a")
    # What `maturin develop` leaves behind in checkout a.
    (a / "python" / "dynamo" / "_core.abi3.so").write_bytes(b"built from a")
    info = site_a / "dynamo_rs-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: dynamo-rs\n")
    (info / "direct_url.json").write_text(json.dumps({"url": a.as_uri()}))
    (site_a / "dynamo_rs.pth").write_text(str(a / "python"))
    key = _key(a)
    assert _run(py_a, "store", str(a), str(cache), key).returncode == 0
    assert _run(py_a, "restore", str(a), str(cache), key).returncode == 0

    b = tmp_path / "b"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("*.so", ".*.key"))
    py_b, site_b = _venv(tmp_path / "venv-b")
    assert _run(py_b, "restore", str(b), str(cache), "0" * 32).returncode == 1, "unknown key"
    assert not (b / "python" / "dynamo" / "_core.abi3.so").exists()
    assert _run(py_b, "restore", str(b), str(cache), _key(b)).returncode == 0
    assert (b / "python" / "dynamo" / "_core.abi3.so").read_bytes() == b"built from a"
    assert (site_b / "dynamo_rs.pth").read_text() == str(b / "python")
    url = json.loads((site_b / "dynamo_rs-0.1.0.dist-info" / "direct_url.json").read_text())
    assert url == {"dir_info": {"editable": True}, "url": b.as_uri()}
    # Checkout a's own install is untouched.
    assert (site_a / "dynamo_rs.pth").read_text() == str(a / "python")


def test_an_extension_replaced_by_hand_is_not_vouched_for(tmp_path) -> None:
    """A `maturin develop` by hand replaces the file under the stamp: the stored build of
    the key is installed again rather than the stamp trusted."""
    cache = tmp_path / "cache"
    a = _checkout(tmp_path / "a")
    py_a, site_a = _venv(tmp_path / "venv-a")
    ext = a / "python" / "dynamo" / "_core.abi3.so"
    ext.write_bytes(b"build of the key")
    (site_a / "dynamo_rs.pth").write_text(str(a / "python"))
    key = _key(a)
    assert _run(py_a, "store", str(a), str(cache), key).returncode == 0
    ext.write_bytes(b"built by hand from other sources")
    assert _run(py_a, "restore", str(a), str(cache), key).returncode == 0
    assert ext.read_bytes() == b"build of the key"
