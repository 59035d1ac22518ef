"""`python -m target_service --model NAME [--port N]`: serve one target model over gRPC."""

from __future__ import annotations

import sys

from specserve.cli import run_worker_service
from target_service.server import serve

if __name__ == "__main__":
    sys.exit(run_worker_service("target", serve))
