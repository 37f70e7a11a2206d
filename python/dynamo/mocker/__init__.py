"""The GPU-free mocker worker: ``python -m dynamo.mocker``."""
