"""The trace: the single record of one decode, shared by engine, store, metrics and dashboard.

Levels (DESIGN.md): the decode itself (settings, code version, clip, segments, reference frames, timings), its
rounds, the draft steps of each round, and every verified token. The pipeline builds it once, complete; metrics
are computed from its rows. Frames count the target's audio-memory positions (`frame_seconds` long: 20 ms for
Whisper) from the start of the clip, so a clip decoded in several 30 s segments keeps one time axis (a segment's
own frame f is clip frame start_frame + f).
"""

import subprocess
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path

import pandas as pd

from specasr import __version__
from specasr.audio import DEFAULT_MAX_SECONDS

# The draft's attention windows (specasr.windows centres them); named here, with the settings, so that naming one
# needs no torch
WINDOWS = ("unrestricted", "correct", "shift", "random", "pointer", "runtime", "runtime-last")
REFERENCE_WINDOWS = ("correct", "shift", "pointer")  # the ones centred from reference frames
RUNTIME_WINDOWS = ("runtime", "runtime-last")  # the ones centred from verification attention
REFERENCE_SOURCES = ("auto", "always", "never")  # or the path of a JSON file of frames
DECODERS = ("specasr", "faster-whisper", "transformers", "transformers-assisted")  # ours, then specasr.peers' peers
DRAFT_PRECISIONS = ("float32", "float16", "bfloat16", "int8")  # the draft's weights (specasr.draft); int8 on a CPU


class SettingsError(ValueError):
    """Settings that cannot be decoded under, alone or with their target: the message says which value and why."""


MOST_TREE_WIDTH = 16
MOST_K = 64  # draft proposals a round may hold


def candidate_count(depth: int, width: int) -> int:
    """Candidates a draft tree drafts (specasr.tree): `width` below the root, and `width` below each of the `width`
    frontier nodes at every later depth."""
    return width + (depth - 1) * width * width


def default_nodes(depth: int, width: int) -> int:
    """Nodes verified per round unless told: `width` per depth (a chain verifies its K proposals)."""
    return depth * width


@dataclass(frozen=True)
class Settings:
    """Everything a decode is asked to do; with a clip, the pipeline's whole input."""

    target: str = "whisper-tiny.en"
    device: str = "cpu"
    dtype: str = "float32"
    draft: str | None = None  # None: greedy; random, random-no-audio, a shipped draft's name, or a draft folder
    draft_dtype: str | None = None  # None: the target's
    k: int = 4  # most proposals per round
    window: str = "unrestricted"
    half_width_ms: float = 400.0
    runtime_layer: int | None = None  # target decoder layer (0-based) for the runtime window; None: the target's
    threshold: float = 0.0  # stop proposing once the draft's top probability falls below this
    aligner: str = "pocketsphinx"
    reference: str = "auto"  # auto: align when the window needs frames; always; never; or a JSON file of frames
    verify_peaks: bool = True  # record where every target layer attended for every transcript token
    keep_attention: bool = False  # keep each draft step's full audio attention row
    max_seconds: float = DEFAULT_MAX_SECONDS  # longer clips are refused
    decoder: str = "specasr"  # our loops, or a peer timed beside them (DECODERS[1:], specasr.peers)
    assistant: str | None = None  # transformers-assisted's assistant: target-layers, a Whisper folder or hub id
    graphs: bool = True  # our loops replay captured steps where the device runs them (CUDA); False: eager steps
    compile: bool | None = None  # our loops' steps compiled by torch.compile; None: the device's default
    tree_width: int = 1  # children drafted below each frontier node (specasr.tree); 1: the chain of K proposals
    tree_nodes: int | None = None  # draft-tree nodes verified per round; None: K x tree_width

    def __post_init__(self):
        if self.window not in WINDOWS:
            raise SettingsError(f"unknown window {self.window!r}; choose one of {', '.join(WINDOWS)}")
        low = 0 if self.draft is None else 1
        if not low <= self.k <= MOST_K:
            raise SettingsError(f"K must be between 1 and {MOST_K}, got {self.k}")
        if not 0 <= self.threshold < 1:
            raise SettingsError(f"the confidence threshold must be in [0, 1), got {self.threshold}")
        if self.decoder not in DECODERS:
            raise SettingsError(f"unknown decoder {self.decoder!r}; choose one of {', '.join(DECODERS)}")
        if self.decoder != "specasr" and (self.draft is not None or self.reference not in ("auto", "never")):
            raise SettingsError(
                f"the {self.decoder} decoder runs greedy and records tokens and timings only: no draft, no reference"
            )
        if (self.assistant is not None) != (self.decoder == "transformers-assisted"):
            raise SettingsError("an assistant goes with the transformers-assisted decoder, and that decoder needs one")
        if not self.half_width_ms >= 0:  # NaN too
            raise SettingsError(
                f"the window half-width must be a number of milliseconds >= 0, got {self.half_width_ms:g}"
            )
        if not self.max_seconds > 0:
            raise SettingsError(f"the length limit must be a number of seconds > 0, got {self.max_seconds:g}")
        if self.draft_dtype not in (None, *DRAFT_PRECISIONS):
            raise SettingsError(
                f"unknown draft precision {self.draft_dtype!r}; choose one of {', '.join(DRAFT_PRECISIONS)}"
            )
        if self.draft_dtype == "int8" and not self.device.startswith("cpu"):
            raise SettingsError(f"int8 draft weights run through fbgemm, on a CPU only, not on {self.device}")
        if self.draft is not None:
            self._check_tree()

    def _check_tree(self) -> None:
        width, nodes = self.tree_width, self.tree_nodes
        if not 1 <= width <= MOST_TREE_WIDTH:
            raise SettingsError(f"the tree width must be between 1 and {MOST_TREE_WIDTH}, got {width}")
        most = candidate_count(self.k, width)
        if nodes is not None and not 1 <= nodes <= most:
            raise SettingsError(
                f"a tree of depth K={self.k} and width {width} drafts {most} candidates: it can verify 1 to {most} "
                f"nodes per round, not {nodes}"
            )
        if width == 1 and nodes not in (None, self.k):
            raise SettingsError(
                f"a chain (tree width 1) verifies its K={self.k} proposals; a node count goes with a tree width above 1"
            )
        if width > 1 and self.threshold > 0:
            raise SettingsError("a confidence threshold cuts a chain (tree width 1); a tree is cut by its node count")

    @property
    def nodes(self) -> int:
        """Draft-tree nodes verified per round: the settings' or K x tree width."""
        return self.tree_nodes if self.tree_nodes is not None else default_nodes(self.k, self.tree_width)

    def readout_layer(self, target_layer: int) -> int:
        """The decoder layer whose verification peaks the runtime windows read: the settings' where they name one,
        else `target_layer`, the target's own choice."""
        return self.runtime_layer if self.runtime_layer is not None else target_layer

    @property
    def needs_reference(self) -> bool:
        """Whether the decode needs reference frames: for its window, or because they were asked for."""
        if self.reference == "auto":
            return self.window in REFERENCE_WINDOWS
        return self.reference != "never"


@dataclass(frozen=True)
class CodeVersion:
    package_version: str
    git_commit: str | None  # None outside a git checkout
    git_dirty: bool | None  # uncommitted changes to tracked files


@cache
def code_version() -> CodeVersion:
    """This process's code: the package version and, in a git checkout, its commit (read once per process)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return CodeVersion(__version__, commit, None if status is None else bool(status))


@dataclass
class Timings:
    """Seconds per phase of the decode (features, encoder, decode: the token loop), timed from the waveform.

    `reference` is the greedy pass and forced alignment that made reference frames for this decode (0 when they
    were reused); it is diagnostic work, not part of the decode's own time.
    """

    features: float = 0.0
    encoder: float = 0.0
    decode: float = 0.0
    reference: float = 0.0

    @property
    def total(self) -> float:
        return self.features + self.encoder + self.decode


@dataclass
class Segment:
    """One window of at most 30 s of the clip, decoded on its own."""

    index: int
    start_frame: int  # clip frame where the window starts
    valid_frames: int  # frames of real audio in the window
    first_token: int  # transcript index of its first token
    tokens: int


@dataclass
class Round:
    """One draft proposal block (a chain, or a tree) followed by one target verification pass."""

    index: int
    segment: int
    start: int  # transcript tokens known before the round
    proposed: list[int]  # every node's token, parents before children (a chain's proposals in order)
    accepted: int  # the accepted path's length
    target_token: int  # the target's own next token after the accepted prefix (end-of-text included)
    draft_seconds: float  # the draft's catch-up on the last round's tokens and its proposals
    verify_seconds: float  # the verification pass and, for the runtime windows, the readout of its attention peaks
    drafted: int  # draft passes: the catch-up and one per further depth drafted (a chain that stops early, fewer)


@dataclass
class DraftStep:
    """One draft proposal, a node of its round's tree (a chain's nodes are its proposals in order): depth 1 is the
    restart, 2..K the continuation; `accepted`: on the path the target accepted."""

    round: int
    depth: int
    token: int
    accepted: bool
    draft_peak: int | None  # clip frame of the head-averaged audio attention peak; None for a no-audio draft
    window_centre: int | None
    reference_frame: int | None
    attention: list[float] | None = None  # the full head-averaged row over the segment's valid frames, when kept
    text: str | None = None  # the proposed token's text; None in runs stored before it was kept
    node: int | None = None  # its index among the round's nodes (a chain's depth - 1); None in runs stored before trees
    parent: int | None = None  # the node it was drafted below; None below the round's root, the last verified token
    probability: float | None = None  # the draft's probability of the token below its parent; None before trees


def spine(round_steps: list[DraftStep]) -> list[DraftStep]:
    """A round's nodes one per depth, as a chain holds its proposals: the accepted path, then below its end the
    draft's most probable child at every depth. A chain's spine is all of its proposals; depth metrics, anchor
    errors and the drift plot read a tree's spine."""
    children: dict[int | None, list[DraftStep]] = {}
    for step in round_steps:
        children.setdefault(step.parent, []).append(step)
    found, parent = [], None
    while parent in children and (not found or parent is not None):  # a step without its node ends the spine
        below = children[parent]
        accepted = [step for step in below if step.accepted]
        step = accepted[0] if accepted else max(below, key=lambda s: -1.0 if s.probability is None else s.probability)
        found.append(step)
        parent = step.node
    return found


@dataclass
class VerifiedToken:
    """A transcript token and the clip frame the target attended most while predicting it, per decoder layer
    (head-averaged, padding excluded)."""

    position: int  # index in the transcript
    token: int
    verify_peaks: list[int]


@dataclass(frozen=True)
class Trace:
    clip_id: str
    settings: Settings  # as the decode ran them: runtime layer and draft dtype filled in
    tokens: list[int]
    text: str
    clip_hash: str = ""
    clip_seconds: float = 0.0
    audio_path: str = ""  # where the clip was read from; "" for an upload, a recording or synthesized speech
    dataset: str = ""
    reference_text: str = ""  # the clip's known transcript, if any
    frame_seconds: float = 0.02  # the target's audio frame
    code: CodeVersion = CodeVersion("", None, None)
    # Each transcript token's own text, leading space included; None in runs stored before it was kept.
    token_texts: list[str] | None = None
    # The layer whose verification peaks the runtime windows read (settings.runtime_layer, else the target's).
    target_runtime_layer: int | None = None
    draft_name: str = "none"  # name@hash, or none for greedy decoding
    draft_hash: str | None = None
    segments: list[Segment] = field(default_factory=list)
    reference_frames: list[int | None] | None = None  # one per transcript token
    reference_source: str | None = None  # the aligner that made the reference frames, or "file"
    # A runtime window's readout: the verification peak at its layer (clip frame) per transcript token; else None.
    runtime_peaks: list[int] | None = None
    timings: Timings = field(default_factory=Timings)
    rounds: list[Round] = field(default_factory=list)
    steps: list[DraftStep] = field(default_factory=list)
    verified: list[VerifiedToken] = field(default_factory=list)

    @property
    def spine(self) -> list[DraftStep]:
        """Every round's spine (`spine`), round by round: the draft steps a chain would hold, one per depth."""
        rounds: dict[int, list[DraftStep]] = {}
        for step in self.steps:
            rounds.setdefault(step.round, []).append(step)
        return [step for steps in rounds.values() for step in spine(steps)]

    @property
    def brief(self) -> str:
        """What the decode made, in a progress line."""
        rounds = f" in {len(self.rounds)} rounds" if self.rounds else ""
        return f"{len(self.tokens)} tokens{rounds} from {self.clip_seconds:.1f} s of audio"

    @property
    def draft_passes(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def draft_seconds(self) -> float:
        return sum(r.draft_seconds for r in self.rounds)

    @property
    def verify_seconds(self) -> float:
        return sum(r.verify_seconds for r in self.rounds)

    def phase_seconds(self) -> dict[str, float]:
        """Every phase, the token loop split into drafting and verification where there were rounds."""
        timings = asdict(self.timings)
        return {**timings, "draft": self.draft_seconds, "verify": self.verify_seconds, "total": self.timings.total}

    def tables(self) -> dict[str, pd.DataFrame]:
        """One DataFrame per level; the decode level is a single row of plain columns."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NESTED}
        row |= asdict(self.settings) | asdict(self.code) | {f"{k}_seconds": v for k, v in asdict(self.timings).items()}
        return {
            "decode": pd.DataFrame([row]),
            **{name: _frame(getattr(self, name), kind) for name, kind in _ROWS.items()},
        }

    @classmethod
    def from_tables(cls, tables: dict[str, pd.DataFrame]) -> "Trace":
        row = _plain(tables["decode"].iloc[0].to_dict())
        nested = {
            "settings": Settings(**{f.name: row[f.name] for f in fields(Settings)}),
            "code": CodeVersion(**{f.name: row[f.name] for f in fields(CodeVersion)}),
            "timings": Timings(**{f.name: row[f"{f.name}_seconds"] for f in fields(Timings)}),
        }
        rows = {name: [kind(**_plain(r)) for r in tables[name].to_dict("records")] for name, kind in _ROWS.items()}
        plain = {f.name: row[f.name] for f in fields(cls) if f.name not in _NESTED}
        return cls(**plain, **nested, **rows)

    def to_dict(self) -> dict:
        """The trace as plain values (JSON holds them, floats exactly): `from_dict` rebuilds an equal trace."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Trace":
        nested = {"settings": Settings, "code": CodeVersion, "timings": Timings}
        built = {name: kind(**values[name]) for name, kind in nested.items()}
        built |= {name: [kind(**row) for row in values[name]] for name, kind in _ROWS.items()}
        return cls(**{name: value for name, value in values.items() if name not in _NESTED}, **built)


_ROWS = {"segments": Segment, "rounds": Round, "steps": DraftStep, "verified": VerifiedToken}
_NESTED = {"settings", "code", "timings", *_ROWS}


def _frame(rows: list, kind: type) -> pd.DataFrame:
    columns = [f.name for f in fields(kind)]
    frame = pd.DataFrame([[getattr(r, c) for c in columns] for r in rows], columns=columns)
    optional_ints = [f.name for f in fields(kind) if f.type == int | None]
    return frame.astype(dict.fromkeys(optional_ints, "Int64"))


def _plain(row: dict) -> dict:
    """Undo pandas' conversions: numpy scalars and arrays to Python, missing values back to None."""
    out = {}
    for key, value in row.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        elif value is pd.NA or value is pd.NaT or (isinstance(value, float) and value != value):
            value = None
        out[key] = value
    return out
