"""``python -m dynamo.select_service``: the runtime-free worker selection service."""
