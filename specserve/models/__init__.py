"""Model presets, artifact fetching and verification, loading, and tokenizer compatibility."""
