"""Exceptions that request handlers raise and that callers catch.

The :class:`DynamoException` family is defined in :mod:`dynamo._core` so that the Rust
runtime can both raise and recognise it: a handler that raises :class:`EngineShutdown`
ends its stream as *incomplete*, which lets the frontend migrate the request to another
worker. :class:`HttpError` is a plain ``Exception`` that an HTTP-facing engine raises to
answer with a specific status code.
"""

from __future__ import annotations

import logging

from dynamo._core import Cancelled as Cancelled
from dynamo._core import CannotConnect as CannotConnect
from dynamo._core import ConnectionTimeout as ConnectionTimeout
from dynamo._core import Disconnected as Disconnected
from dynamo._core import DynamoException as DynamoException
from dynamo._core import EngineShutdown as EngineShutdown
from dynamo._core import InvalidArgument as InvalidArgument
from dynamo._core import RouterQueueLimitExceeded as RouterQueueLimitExceeded
from dynamo._core import SelectionServiceError as SelectionServiceError
from dynamo._core import StreamIncomplete as StreamIncomplete
from dynamo._core import Unknown as Unknown

__all__ = [
    "Cancelled",
    "CannotConnect",
    "ConnectionTimeout",
    "Disconnected",
    "DynamoException",
    "EngineShutdown",
    "HttpError",
    "InvalidArgument",
    "RouterQueueLimitExceeded",
    "SelectionServiceError",
    "StreamIncomplete",
    "Unknown",
]

logger = logging.getLogger(__name__)

#: Longest message an :class:`HttpError` carries; longer ones are truncated so that a
#: runaway error text cannot bloat responses and logs.
_MAX_MESSAGE_LENGTH = 8192


class HttpError(Exception):
    """An error with an HTTP status code, returned to the HTTP client as that status.

    ``str(err)`` is ``"HTTP {code}: {message}"``. Invalid arguments raise ``ValueError``.
    """

    code: int
    message: str

    def __init__(self, code: int, message: str) -> None:
        # Validate eagerly with ValueError: a bad code discovered later, while building the
        # HTTP response, would surface far from the handler that raised it.
        if isinstance(code, bool) or not isinstance(code, int):
            raise ValueError(f"HttpError code must be an int, got {type(code).__name__}")
        if not isinstance(message, str):
            raise ValueError(f"HttpError message must be a str, got {type(message).__name__}")
        if not 0 <= code < 600:
            raise ValueError(f"HttpError code must be in [0, 600), got {code}")
        if len(message) > _MAX_MESSAGE_LENGTH:
            logger.warning(
                "HttpError message of %d characters truncated to %d",
                len(message),
                _MAX_MESSAGE_LENGTH,
            )
            message = message[: _MAX_MESSAGE_LENGTH - 3] + "..."
        self.code = code
        self.message = message
        super().__init__(f"HTTP {code}: {message}")
