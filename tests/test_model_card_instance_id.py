"""``ModelCardInstanceId``: exported like the reference's, built only by the runtime."""

from __future__ import annotations

import pytest

import dynamo._core as core
import dynamo.llm


def test_exported_from_core_and_llm() -> None:
    assert dynamo.llm.ModelCardInstanceId is core.ModelCardInstanceId
    assert core.ModelCardInstanceId.__module__ == "dynamo._core"


def test_has_no_python_constructor() -> None:
    # The reference: "No constructor defined for ModelCardInstanceId" (its PyO3 version's
    # wording); ours: "cannot create 'dynamo._core.ModelCardInstanceId' instances".
    with pytest.raises(TypeError, match="ModelCardInstanceId"):
        core.ModelCardInstanceId()
    with pytest.raises(TypeError):
        core.ModelCardInstanceId("ns", "comp", "ep")


def test_exposes_triple_only() -> None:
    public = {n for n in dir(core.ModelCardInstanceId) if not n.startswith("_")}
    assert public == {"triple"}
