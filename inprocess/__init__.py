"""Both roles' workers in one process, no gRPC: `specserve generate --local`, the bench, tests."""
