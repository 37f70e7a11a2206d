"""Distributed LLM-inference serving runtime with NVIDIA Dynamo's Python API.

The work is done by the Rust extension module :mod:`dynamo._core`; the Python packages add
decorators, logging, entry points and re-exports:

* :mod:`dynamo.runtime`: distributed runtime, endpoints, clients, ``@dynamo_worker``.
* :mod:`dynamo.llm`: model registration, KV routing, block hashing, exceptions.
"""

from dynamo._core import __version__

__all__ = ["__version__"]
