"""The errors a user causes and can fix (bad audio, a model or aligner not at hand, a draft for another target,
settings that cannot be decoded, a store that refuses), gathered from where they are raised: the command line
tells them in one line, the dashboard on the page."""

from specasr.align import AlignerUnavailableError, AlignmentError
from specasr.audio import AudioError
from specasr.clipset import ClipSetError
from specasr.compare import NoSharedClipError
from specasr.draft import DraftMismatchError
from specasr.store import StoreError
from specasr.targets import TargetUnavailableError
from specasr.trace import SettingsError

USER_ERRORS = (
    AudioError,
    TargetUnavailableError,
    DraftMismatchError,
    AlignmentError,
    AlignerUnavailableError,
    FileNotFoundError,
    SettingsError,
    StoreError,
    ClipSetError,
    NoSharedClipError,
)
