"""``python -m dynamo.slot_tracker``: the standalone KV router slot tracker."""
