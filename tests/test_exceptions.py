"""The exception hierarchy of dynamo._core and dynamo.llm.exceptions.HttpError."""

from __future__ import annotations

import logging

import pytest

import dynamo._core as core
from dynamo.llm import exceptions

SUBCLASSES = [
    "Unknown",
    "InvalidArgument",
    "CannotConnect",
    "Disconnected",
    "ConnectionTimeout",
    "Cancelled",
    "EngineShutdown",
    "StreamIncomplete",
    "RouterQueueLimitExceeded",
    "SelectionServiceError",
]


@pytest.mark.parametrize("name", SUBCLASSES)
def test_subclass_of_dynamo_exception(name: str) -> None:
    cls = getattr(core, name)
    assert issubclass(cls, core.DynamoException)
    assert cls.__module__ == "dynamo._core"
    assert getattr(exceptions, name) is cls
    err = cls("boom")
    assert str(err) == "boom"
    with pytest.raises(core.DynamoException):
        raise err


def test_dynamo_exception_is_an_exception() -> None:
    assert issubclass(core.DynamoException, Exception)
    assert exceptions.DynamoException is core.DynamoException
    assert not issubclass(exceptions.HttpError, core.DynamoException)


def test_typed_attributes_can_be_set() -> None:
    err = core.RouterQueueLimitExceeded("queue full")
    err.policy_class, err.limit_kind, err.current, err.limit = "default", "requests", 10, 10
    assert (err.current, err.limit) == (10, 10)


def test_http_error_fields_and_message() -> None:
    err = exceptions.HttpError(404, "no such model")
    assert (err.code, err.message) == (404, "no such model")
    assert str(err) == "HTTP 404: no such model"


@pytest.mark.parametrize(
    ("code", "message"),
    [(True, "x"), ("404", "x"), (4.0, "x"), (600, "x"), (-1, "x"), (400, 5)],
)
def test_http_error_validation(code, message) -> None:
    with pytest.raises(ValueError):
        exceptions.HttpError(code, message)


def test_http_error_truncates_long_messages(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="dynamo.llm.exceptions"):
        err = exceptions.HttpError(500, "x" * 10_000)
    assert len(err.message) == 8192
    assert err.message.endswith("...")
    assert "truncated" in caplog.text
