"""The shape of the code: crates stay on their floors and no module imports one that imports
it back.

* The crate graph that `cargo metadata` reports must follow the floors declared in the root
  `Cargo.toml` (`[workspace.metadata.floors]`): a crate depends only on lower floors.
* Inside each crate, no source file may reach itself through `crate::` / `super::` paths
  (a circle of files), and no module of the `dynamo` Python package may import itself back.

These are static checks of the tree (no build needed beyond `cargo metadata`), so a change
that pulls a layer upwards fails here with the files and names that tie the circle.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CRATES = REPO / "crates"


def workspace_metadata() -> dict:
    cargo = shutil.which("cargo")
    assert cargo, "cargo is needed to read the crate graph"
    out = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def declared_floors() -> dict[str, int]:
    # `cargo metadata` reports `[workspace.metadata]` as its top-level `metadata`.
    return workspace_metadata()["metadata"]["floors"]


def test_every_crate_has_a_floor() -> None:
    floors = declared_floors()
    members = {p["name"] for p in workspace_metadata()["packages"]}
    assert members == set(floors), (
        "crates without a floor or floors without a crate: "
        f"{sorted(members ^ set(floors))}; add them to [workspace.metadata.floors]"
    )


def test_crates_depend_only_downwards() -> None:
    floors = declared_floors()
    wrong = []
    for pkg in workspace_metadata()["packages"]:
        for dep in pkg["dependencies"]:
            if dep["name"] in floors and floors[dep["name"]] >= floors[pkg["name"]]:
                kind = dep["kind"] or "normal"
                wrong.append(
                    f"{pkg['name']} (floor {floors[pkg['name']]}) -> {dep['name']} "
                    f"(floor {floors[dep['name']]}, {kind} dependency)"
                )
    assert not wrong, "dependencies that do not go down a floor:\n" + "\n".join(wrong)


# --- Rust: circles among the source files of one crate -----------------------------------

PATH_HEAD = re.compile(r"\b(crate|super|self)::")
IDENT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*")
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*(?:;|\{)")


def rust_modules(src: Path) -> dict[tuple[str, ...], Path]:
    """Module path -> file, for every `.rs` file under `src` (`lib.rs` is the root)."""
    mods = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "mod":
            parts.pop()
        if parts in (["lib"], ["main"]):
            parts = []
        mods[tuple(parts)] = f
    return mods


def strip_rust(text: str) -> str:
    """The code without comments and without the unit tests at the end of a file."""
    match = TEST_MODULE.search(text)
    if match:
        text = text[: match.start()]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def rust_paths(text: str) -> Iterable[list[str]]:
    """Every `crate::` / `super::` / `self::` path, with `{a, b::c}` groups expanded."""
    found: list[list[str]] = []

    def walk(prefix: list[str], at: int) -> int:
        segs = list(prefix)
        while at < len(text):
            m = IDENT.match(text, at)
            if m:
                segs.append(m.group(1))
                at = m.end()
                if text.startswith("::", at):
                    at += 2
                    continue
                break
            if text.startswith("{", at):
                depth, i, start = 0, at, at + 1
                while i < len(text):
                    c = text[i]
                    if c == "{":
                        depth += 1
                    elif c == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    elif c == "," and depth == 1:
                        walk(segs, start)
                        start = i + 1
                    i += 1
                walk(segs, start)
                return i + 1
            break
        found.append(segs)
        return at

    for m in PATH_HEAD.finditer(text):
        walk([m.group(1)], m.end())
    return found


def rust_edges(src: Path) -> dict[tuple[str, ...], dict[tuple[str, ...], set[str]]]:
    mods = rust_modules(src)
    edges: dict[tuple[str, ...], dict[tuple[str, ...], set[str]]] = {m: {} for m in mods}
    for mod, file in mods.items():
        for segs in rust_paths(strip_rust(file.read_text())):
            base, i = list(mod), 1
            if segs[0] == "crate":
                base = []
            else:
                i = 0
                while i < len(segs) and segs[i] in ("super", "self"):
                    if segs[i] == "super":
                        base = base[:-1]
                    i += 1
            path = base + segs[i:]
            # The longest prefix that is a file: `crate::a::b::Name` names file a/b.rs.
            target = next(
                (tuple(path[:k]) for k in range(len(path), -1, -1) if tuple(path[:k]) in mods),
                None,
            )
            if target is not None and target != mod:
                edges[mod].setdefault(target, set()).add(segs[-1])
    return edges


def circles(edges: dict) -> list[list]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    found = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def describe(comp: list, edges: dict, name) -> str:
    inside = set(comp)
    lines = [f"circle of {len(comp)}: " + ", ".join(sorted(name(c) for c in comp))]
    for a in sorted(comp, key=name):
        for b, names in sorted(edges[a].items(), key=lambda kv: name(kv[0])):
            if b in inside:
                lines.append(f"    {name(a)} -> {name(b)}: {', '.join(sorted(names))}")
    return "\n".join(lines)


@pytest.mark.parametrize("crate", sorted(p.name for p in CRATES.iterdir() if (p / "src").is_dir()))
def test_no_import_circles_among_rust_files(crate: str) -> None:
    src = CRATES / crate / "src"
    edges = rust_edges(src)

    def name(mod: tuple[str, ...]) -> str:
        return str(rust_modules(src)[mod].relative_to(CRATES))

    found = circles(edges)
    assert not found, "\n".join(describe(c, edges, name) for c in found)


def test_the_rust_checker_sees_a_circle(tmp_path: Path) -> None:
    # The check above must be able to fail: two files that name each other are a circle.
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.rs").write_text("pub mod a;\npub mod b;\n")
    (src / "a.rs").write_text("use crate::b::{B, helper};\npub struct A;\n")
    (src / "b.rs").write_text("pub struct B(crate::a::A);\n// crate::nothing\n")
    edges = rust_edges(src)
    assert [sorted(c) for c in circles(edges)] == [[("a",), ("b",)]]
    assert edges[("a",)][("b",)] == {"B", "helper"}


# --- Python: circles among the modules of the `dynamo` package ---------------------------

PACKAGE = REPO / "python" / "dynamo"


def python_modules() -> dict[str, Path]:
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = f
    return mods


def python_edges() -> dict[str, dict[str, set[str]]]:
    mods = python_modules()
    edges: dict[str, dict[str, set[str]]] = {m: {} for m in mods}
    for mod, file in mods.items():
        package = mod if file.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text())):
            targets: list[tuple[str, str]] = []
            if isinstance(node, ast.Import):
                targets = [(a.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                # `from pkg import sub` imports the submodule when there is one.
                targets = [
                    (f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base, a.name)
                    for a in node.names
                ]
            for target, label in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    edges[mod].setdefault(target, set()).add(label)
    return edges


def test_no_import_circles_in_the_python_package() -> None:
    edges = python_edges()
    found = circles(edges)
    assert not found, "\n".join(describe(c, edges, str) for c in found)
