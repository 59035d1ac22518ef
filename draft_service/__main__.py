"""`python -m draft_service --model NAME [--port N]`: serve one draft model over gRPC."""

from __future__ import annotations

import sys

from specserve.openmp import configure_openmp

configure_openmp()  # before torch loads

from draft_service.server import serve  # noqa: E402
from specserve.cli import run_worker_service  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_worker_service("draft", serve))
