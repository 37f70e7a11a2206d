"""The stub `_core.pyi` describes exactly what `dynamo._core` exports."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import dynamo
import dynamo._core as core

STUB = Path(dynamo.__file__).with_name("_core.pyi")
#: Module attributes that are not API names.
NON_API = {"__all__", "__doc__", "__file__", "__loader__", "__name__", "__package__", "__spec__"}
#: Stub-only names: typing helpers that do not exist at run time.
# Names the stub declares only for typing: the replay result's class is what
# `run_mocker_trace_replay` returns, not something users construct or import.
TYPING_ONLY: set[str] = {"_OfflineReplayResult"}


def stub_names() -> set[str]:
    tree = ast.parse(STUB.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names - NON_API


def module_names() -> set[str]:
    return {n for n in dir(core) if not n.startswith("_") or n == "__version__"} - NON_API


def test_every_module_name_is_in_the_stub() -> None:
    missing = module_names() - stub_names()
    assert not missing, f"exported by dynamo._core but not declared in _core.pyi: {sorted(missing)}"


def test_every_stub_name_exists_in_the_module() -> None:
    missing = stub_names() - module_names() - TYPING_ONLY
    assert not missing, f"declared in _core.pyi but missing from dynamo._core: {sorted(missing)}"


def test_functions_have_text_signatures() -> None:
    # stubtest can only compare signatures that the runtime exposes.
    for name in module_names():
        obj = getattr(core, name)
        if inspect.isbuiltin(obj):
            assert obj.__text_signature__, f"{name} has no __text_signature__"
