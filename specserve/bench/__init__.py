"""`specserve bench`: side-by-side throughput of target-only, speculative and peer decoding."""
