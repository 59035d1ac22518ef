"""specserve: lossless speculative decoding, served."""

__version__ = "0.1.0"
