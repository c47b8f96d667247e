"""specasr: single-model speculative decoding for speech recognition."""
