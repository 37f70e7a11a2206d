"""Caller-side classes of request-plane errors (raised by ``dynamo._core``, not imported).

The reference (ai-dynamo-runtime 1.6.1) raises ``ValueError`` for every error a response
stream ends with: a handler's exception (``"Internal: RuntimeError: boom"``), a stream cut
short (``"Unavailable: Stream ended before generation completed"``). This project raises
the runtime's typed classes (``Disconnected``, ``Cancelled``, ...); each class here derives
from both, so code written for either implementation catches it. They keep the typed
class's name and module, so ``type(e).__name__`` reads ``"Disconnected"``.
"""

from __future__ import annotations

from dynamo import _core


def _both(base: type[BaseException]) -> type[BaseException]:
    return type(
        base.__name__,
        (base, ValueError),
        {"__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__},
    )


Unknown = _both(_core.Unknown)
InvalidArgument = _both(_core.InvalidArgument)
CannotConnect = _both(_core.CannotConnect)
Disconnected = _both(_core.Disconnected)
ConnectionTimeout = _both(_core.ConnectionTimeout)
Cancelled = _both(_core.Cancelled)
EngineShutdown = _both(_core.EngineShutdown)
StreamIncomplete = _both(_core.StreamIncomplete)
