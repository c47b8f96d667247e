"""A command's result goes out first: printed, and written to its --out file; the store keeps its runs second. A
copy that cannot be kept (the file's, the store's) is told in one line on stderr, and the command ends with status 1:
the result itself is never lost."""

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pandas as pd

from specasr.store import Store, StoreError, default_db_path

T = TypeVar("T")


def _not_kept(message: str) -> None:
    print(f"specasr: {message}", file=sys.stderr)


class Report:
    """What a command prints, kept to be written to its --out file as well."""

    def __init__(self, out: Path | None = None):
        self.out = out
        self.lines: list[str] = []
        self.failed = False

    def print(self, text: str = "") -> None:
        print(text)
        self.lines.append(text)

    def warn(self, *warnings: str | None) -> None:
        for warning in filter(None, warnings):
            self.print(f"warning: {warning}")

    def save(self) -> None:
        if self.out is None:
            return
        try:
            self.out.write_text("".join(f"{line}\n" for line in self.lines))
        except OSError as error:
            self.failed = True
            _not_kept(f"result not written to {self.out}: {error.strerror or error}")


class RunStore:
    """The store a command keeps its runs in. It is opened before the work where it opens (its reference-frame cache
    serves the decodes) and written after the result is out."""

    def __init__(self, path: Path | None, wanted: bool = True):
        self.path = path or default_db_path()
        self.store: Store | None = None
        self.failure: StoreError | None = None
        if wanted:
            try:
                self.store = Store(path)
            except StoreError as error:
                self.failure = error

    def write(self, write: Callable[[Store], T]) -> T | None:
        """`write(store)`; None where the store is not wanted or could not take it (`finish` tells)."""
        if self.store is None:
            return None
        try:
            return write(self.store)
        except StoreError as error:
            self.failure = error
            return None

    def finish(self, refused: Sequence[str] = ()) -> int:
        """The command's status once its result is out: 1, told on stderr, where the store could not keep it (did
        not open, failed a write, or refused the writes the command lists in `refused`)."""
        return not_stored(self.path, [*([] if self.failure is None else [str(self.failure)]), *refused])


def not_stored(path: Path, reasons: list[str]) -> int:
    """The command's status once its result is out: 1 where the store refused some of it, each reason on stderr."""
    for reason in reasons:
        _not_kept(f"result not stored in {path}: {reason}")
    return int(bool(reasons))


def records(table: pd.DataFrame) -> list[dict]:
    """A table's rows for JSON: missing values as null (JSON has no NaN)."""
    return table.astype(object).where(table.notna(), None).to_dict("records")


def json_value(value):
    """numpy scalars (booleans among them) as plain JSON values."""
    return value.item() if hasattr(value, "item") else str(value)
