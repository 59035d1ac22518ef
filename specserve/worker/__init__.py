"""The worker runtime: what runs a model for either role (draft or target) behind its gRPC service."""
