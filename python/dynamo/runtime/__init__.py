"""Distributed runtime: endpoints, clients and the ``@dynamo_worker`` decorator.

The runtime classes (``DistributedRuntime``, ``Endpoint``, ``Client``, ``Context``) are
implemented in :mod:`dynamo._core` and re-exported here as they land.
"""

__all__: list[str] = []
