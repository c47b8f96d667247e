"""Where specasr keeps converted weights and derived files, and how it writes them safely."""

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STALE_SCRATCH_SECONDS = 3600


def cache_root() -> Path:
    """$SPECASR_CACHE, else the repository's cache/ folder."""
    configured = os.environ.get("SPECASR_CACHE")
    return Path(configured) if configured else Path(__file__).resolve().parents[1] / "cache"


def cache_dir() -> Path:
    """The cache root, made if missing."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a scratch folder that becomes (or replaces) `final` only if the block completes.

    An exception or a kill inside the block leaves `final` as it was, so readers never see
    a half-written result. Scratch folders left by killed processes are removed once stale.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        if time.time() - stale.stat().st_mtime > STALE_SCRATCH_SECONDS:
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    scratch.chmod(0o755)
    try:
        yield scratch
        if final.exists():
            previous = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
            final.rename(previous / final.name)
            scratch.rename(final)
            shutil.rmtree(previous)
        else:
            scratch.rename(final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
