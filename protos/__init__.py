"""Generated gRPC code for specserve.v1 (regenerate: `make protos`) and its conversions."""
