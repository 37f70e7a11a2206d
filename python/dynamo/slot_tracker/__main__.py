"""Entry point of ``python -m dynamo.slot_tracker`` (the flags are parsed by clap in Rust; ``--help``
lists them). The service blocks until SIGINT or SIGTERM, then shuts down cleanly."""

import sys
from collections.abc import Sequence

from dynamo._core import run_slot_tracker


def main(argv: Sequence[str] | None = None) -> int:
    run_slot_tracker(list(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
