"""specasr: single-model speculative decoding for speech recognition."""

import os

from specasr.cache import cache_root

__version__ = "0.2.0"

# torch.compile keeps its kernels with our other derived files, so that a second process does not compile again; set
# before torch is imported, which fixes inductor's folder on first use
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
