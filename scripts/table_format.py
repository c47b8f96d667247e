"""What every table of scripts/tables.py shares: where the stored outputs lie, and how a figure is written."""

import io
import json
import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "measurements"
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
TARGETS = ("whisper-tiny.en", "whisper-base")
CPU = MEASURED / "cpu-2026-12-05"
COMPILE = MEASURED / "compile-2026-12-05"
TREES = MEASURED / "trees-2026-12-05"
H200 = MEASURED / "h200-2026-12-04"
ANCHOR_2X2 = MEASURED / "anchor-2x2-2026-12-04"
DRAFT_STEPS = MEASURED / "cpu-2026-12-07"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def short(target: str) -> str:
    return target.removeprefix("whisper-")


def number(value: float | None, digits: int = 3, sign: bool = False) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def span(estimate: float, low: float, high: float, digits: int = 3, sign: bool = False, unit: str = "") -> str:
    """An estimate with its 95% interval, as 1.135x [1.061, 1.186]."""
    return f"{number(estimate, digits, sign)}{unit} [{number(low, digits, sign)}, {number(high, digits, sign)}]"


def interval(row, name: str, digits: int = 3, sign: bool = False, unit: str = "", estimate: str | None = None) -> str:
    """`name` of a record with its `name_low` and `name_high` (the estimate under another key where given)."""
    return span(row[estimate or name], row[f"{name}_low"], row[f"{name}_high"], digits, sign, unit)


def speed(row: dict, phase: str, digits: int = 3) -> str:
    """A bench arm's pooled speedup in `phase` (decode, total) with its interval."""
    return interval(row, f"{phase}_speedup", digits, unit="x", estimate=f"{phase}_speedup_pooled")


def unreliable(record: dict) -> str:
    """What a figure of a run whose A/A check failed carries beside it."""
    return "" if record["timing"]["aa"]["reliable"] else " UNRELIABLE"


def stored(path: Path) -> dict:
    return json.loads(path.read_text())


def text_section(path: Path, title: str, spaced: str | None = None) -> pd.DataFrame:
    """The table printed under the line starting with `title` in a command's stored text output. Values hold no
    spaces, except in the columns up to `spaced`, which come back joined as one column of that name."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) + 1
    header = lines[start].split()
    if spaced is not None:
        header = header[header.index(spaced) :]
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows.append([" ".join(cells[: len(cells) - len(header) + 1]), *cells[len(cells) - len(header) + 1 :]])
    return pd.read_csv(io.StringIO("\n".join("\t".join(row) for row in [header, *rows])), sep="\t")


PHASE_NAMES = {"decode": "decode", "total": "end to end"}


def aa_line(record: dict) -> str:
    """The A/A check of an experiment or bench record, each phase, with the run's verdict."""
    phases = "; ".join(
        f"{PHASE_NAMES[row['phase']]} {span(row['ratio'], row['low'], row['high'], unit='x')}" for row in record["aa"]
    )
    verdict = "reliable" if record["timing"]["aa"]["reliable"] else "**UNRELIABLE**"
    return f"A/A, greedy over its copy: {phases} (tolerance +-{record['timing']['aa']['tolerance']:.0%}): {verdict}"
