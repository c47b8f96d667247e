"""python -m specasr COMMAND ...: one module per command, each with add_parser(commands) and run(args); the options
they share, and the one way options become Settings, in options.py; how a result gets out before the store keeps it,
in output.py."""

import argparse
import sys

from specasr.audio import AudioTooLongError
from specasr.cli import (
    align,
    bench,
    decode,
    drafts,
    evaluate,
    experiment,
    matched,
    precision,
    profile,
    runs,
    train,
    transcribe,
)
from specasr.cli.options import UsageError
from specasr.errors import USER_ERRORS

DESCRIPTION = "transcribe, decode, align, eval, bench, profile, precision, experiment, matched, runs, train, drafts"
COMMANDS = (transcribe, evaluate, decode, align, runs, experiment, matched, train, drafts, profile, precision, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specasr", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command: status 0; 1 where its result is out but a copy of it was not kept (output.py) or, for runs
    doctor, orphans were found; 2 for a user error, told in one line; 130 for Ctrl-C, told in one line (for a grid:
    what the store kept and how to resume)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except KeyboardInterrupt as error:
        print(f"interrupted: {error}" if str(error) else "interrupted", file=sys.stderr)
        return 130
    except (*USER_ERRORS, UsageError) as error:
        remedy = "; raise it with --max-seconds, or split the clip" if isinstance(error, AudioTooLongError) else ""
        print(f"error: {error}{remedy}", file=sys.stderr)
        return 2
