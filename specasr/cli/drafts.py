"""drafts: the drafts that come with specasr."""

import argparse

from specasr.draft import shipped_drafts


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("drafts", help="list the drafts that come with specasr")
    p.add_argument("--target", default=None)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    for name in shipped_drafts(args.target):
        print(name)
