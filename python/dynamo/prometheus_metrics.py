"""Prometheus metrics hooks of the runtime: ``endpoint.metrics`` is a
:class:`RuntimeMetrics`."""

from dynamo._core import RuntimeMetrics

__all__ = ["RuntimeMetrics"]
