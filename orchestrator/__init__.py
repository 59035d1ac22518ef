"""The orchestrator: the speculative loop over remote draft and target services, pipelined."""
