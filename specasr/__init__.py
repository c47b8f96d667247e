"""specasr: single-model speculative decoding for speech recognition.

    import specasr

    pipeline, clip = specasr.Pipeline(), specasr.load_clip("clip.wav")
    trace = pipeline.decode(clip, specasr.Settings(target="whisper-tiny.en", draft="whisper-tiny.en/control"))

Everything named in `__all__` is the public API: what a user needs and all that the command line's and the
dashboard's faces import (besides `specasr.views`). Names load with their module on first use, so that
`import specasr` is quick and imports no torch.
"""

import importlib
import os

from specasr.cache import cache_root

__version__ = "0.2.0"

# torch.compile keeps its kernels with our other derived files, so that a second process does not compile again; set
# before torch is imported, which fixes inductor's folder on first use
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))

_EXPORTS = {
    # a clip, its settings, its decode
    "specasr.audio": (
        "SAMPLE_RATE",
        "DEFAULT_MAX_SECONDS",
        "Clip",
        "load_clip",
        "load_audio",
        "split_windows",
        "AudioError",
        "AudioTooLongError",
    ),
    "specasr.trace": (
        "Settings",
        "SettingsError",
        "WINDOWS",
        "REFERENCE_WINDOWS",
        "RUNTIME_WINDOWS",
        "DRAFT_PRECISIONS",
        "MOST_TREE_WIDTH",
        "candidate_count",
        "default_nodes",
        "Trace",
        "Round",
    ),
    "specasr.pipeline": ("Pipeline",),
    "specasr.targets": ("BUILTIN_TARGETS", "DTYPES", "TargetUnavailableError"),
    "specasr.draft": ("shipped_drafts", "DraftMismatchError"),
    "specasr.align": ("AlignmentError", "AlignerUnavailableError"),
    "specasr.tts": ("synthesize_espeak",),
    "specasr.errors": ("USER_ERRORS",),
    "torch": ("OutOfMemoryError",),
    # clips and their sets
    "specasr.clipset": ("ClipSetError",),
    "specasr.dataset": ("DEFAULT_SPEECH_DIR", "Utterance", "load_manifest", "clips_by_set"),
    "specasr.cache": ("cache_dir",),
    # the run store
    "specasr.store": ("Store", "StoreError"),
    "specasr.transfer": ("export_runs",),
    # measurements
    "specasr.metrics": (
        "word_error_rate",
        "acceptance",
        "depth_profile",
        "rho",
        "correction_pays",
        "predicted_speed_change",
    ),
    "specasr.intervals": ("aa_verdict", "aa_warning", "unreliable_mark"),
    "specasr.pooled": ("Weighting", "weighting"),
    "specasr.bench": ("benchmark", "aa_check", "store_results"),
    "specasr.experiments": ("Grid", "GridRuns", "REPEATS", "run_grid", "stored_grid", "grid_traces", "draft_label"),
    "specasr.report": ("AGGREGATION", "RUNTIME_BASES", "repetition_note"),
    "specasr.compare": ("Comparison", "DIFFERENCE", "compare_runs", "NoSharedClipError", "Word", "word_diff"),
}
# Names that say at the top level what their module's name says beside them (and `specasr.compare` is a module)
_RENAMED = {
    "compare_traces": ("specasr.compare", "compare"),
    "spread_clips": ("specasr.dataset", "spread"),
    "bench_summary": ("specasr.bench", "summary"),
    "experiment_tables": ("specasr.report", "tables"),
}
_MODULES = ("clipset",)  # a dataset decoded clip by clip, resumable: its page uses the module whole
_HOMES = {name: (module, name) for module, names in _EXPORTS.items() for name in names} | _RENAMED

__all__ = ["__version__", "devices", *_HOMES, *_MODULES]


def devices() -> list[str]:
    """The devices a decode can run on here, CUDA first where there is one."""
    import torch

    return (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _HOMES[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
