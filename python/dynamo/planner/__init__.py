"""The planner's Python surface: the virtual connector classes (``dynamo._core``) and the
``python -m dynamo.planner`` entry point (the loop itself is Rust:
``dynamo._core.run_planner``)."""

from dynamo._core import PlannerDecision as PlannerDecision
from dynamo._core import VirtualConnectorClient as VirtualConnectorClient
from dynamo._core import VirtualConnectorCoordinator as VirtualConnectorCoordinator

__all__ = ["PlannerDecision", "VirtualConnectorClient", "VirtualConnectorCoordinator"]
