"""Generated gRPC code for specserve.v1 (regenerate: `make protos`); conversions live with their users."""
