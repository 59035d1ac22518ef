"""The Python client of specserve's public gRPC API: grpc and protobuf only, no model libraries."""

from specserve_client.client import AsyncSpecServeClient, SpecServeClient, build_request

__all__ = ["AsyncSpecServeClient", "SpecServeClient", "build_request"]
