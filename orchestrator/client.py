"""The public API's client, kept importable here for code written against this path: specserve_client."""

from specserve_client import AsyncSpecServeClient, SpecServeClient, build_request

__all__ = ["AsyncSpecServeClient", "SpecServeClient", "build_request"]
