"""`python -m draft_service --model NAME [--port N]`: serve one draft model over gRPC."""

from __future__ import annotations

import sys

from draft_service.server import serve
from specserve.cli import run_worker_service

if __name__ == "__main__":
    sys.exit(run_worker_service("draft", serve))
