"""`python -m target_service --model NAME [--port N]`: serve one target model over gRPC."""

from __future__ import annotations

import sys

from specserve.openmp import configure_openmp

configure_openmp()  # before torch loads

from specserve.cli import run_worker_service  # noqa: E402
from target_service.server import serve  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_worker_service("target", serve))
