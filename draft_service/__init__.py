"""The draft side: a small model that proposes k tokens per round."""
