"""``python -m dynamo.indexer``: the standalone KV cache indexer service."""
