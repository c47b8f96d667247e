"""specasr: single-model speculative decoding for speech recognition."""

__version__ = "0.2.0"
