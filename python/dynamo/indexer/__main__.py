"""Entry point of ``python -m dynamo.indexer`` (the flags are parsed by clap in Rust; ``--help``
lists them). The service blocks until SIGINT or SIGTERM, then shuts down cleanly."""

import sys
from collections.abc import Sequence

from dynamo._core import run_kv_indexer


def main(argv: Sequence[str] | None = None) -> int:
    run_kv_indexer(list(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
