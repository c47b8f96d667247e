"""runs: the run store: list, show, export, import, delete, and the doctor that finds rows no run holds."""

import argparse
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from specasr.cli.options import UsageError, add_store_options, number
from specasr.store import Store
from specasr.stored_metrics import run_summary
from specasr.trace import WINDOWS
from specasr.transfer import export_runs, import_runs

ACTIONS = ("list", "show", "export", "import", "delete", "doctor")
FILTERS = ("target", "draft", "window", "k", "dataset", "since", "until")


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("runs", help="the run store: list, show, export, import or delete runs; doctor it")
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("run_id", metavar="RUN", nargs="?", default=None, help="run id (import: an export's folder)")
    p.add_argument("--parquet", type=Path, default=None, help="export: the folder for the Parquet files")
    p.add_argument("--force", action="store_true", help="export: replace an earlier export in that folder")
    p.add_argument("--fix", action="store_true", help="doctor: remove the orphan rows it finds")
    p.add_argument(
        "--trust-unverified",
        action="store_true",
        help="import: take an export without its manifest (checked for consistency only)",
    )
    p.add_argument("--target", default=None, help="list, export: only runs of this target")
    p.add_argument("--draft", default=None, help="list, export: only runs of this draft")
    p.add_argument("--window", default=None, choices=WINDOWS, help="list, export: only runs with this window")
    p.add_argument("--k", type=number(int, 1), default=None, help="list, export: only runs with this K")
    p.add_argument("--dataset", default=None, help="list, export: only runs that decoded clips of this dataset")
    p.add_argument(
        "--since",
        type=datetime.fromisoformat,
        default=None,
        help="list, export: only runs created at or after this UTC time (2026-11-30)",
    )
    p.add_argument(
        "--until",
        type=datetime.fromisoformat,
        default=None,
        help="list, export: only runs created at or before this UTC time",
    )
    p.add_argument("--json", action="store_true")
    add_store_options(p, optional=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    store = Store(args.db)
    filters = {name: getattr(args, name) for name in FILTERS}
    if args.action == "list":
        runs = store.runs(**filters)
        if args.json:
            print(runs.to_json(orient="records", date_format="iso"))
        else:
            print(runs.to_string(index=False) if len(runs) else f"no runs in {store.path}")
    elif args.action == "export":
        if args.parquet is None:
            raise UsageError("runs export needs --parquet DIR")
        run_ids = [args.run_id] if args.run_id else store.runs(**filters).run_id.tolist()
        if not run_ids:
            raise UsageError(f"no run in {store.path} matches those filters")
        for path in export_runs(store, run_ids, args.parquet, force=args.force):
            print(path)
    elif args.action == "doctor":
        return _doctor(store, args.fix)
    elif args.run_id is None:
        raise UsageError(f"runs {args.action} needs a run id (python -m specasr runs list)")
    elif args.action == "show":
        traces = store.traces(args.run_id)
        if args.json:
            print(json.dumps([asdict(t) for t in traces]))
        else:
            print(run_summary(store, [args.run_id]).T.to_string(header=False))
            for trace in traces:
                print(f"  {trace.clip_id}: {trace.text}")
    elif args.action == "delete":
        store.delete_run(args.run_id)
        print(f"deleted run {args.run_id} from {store.path}")
    elif args.action == "import":
        for run_id in import_runs(store, Path(args.run_id), args.trust_unverified):
            print(f"imported run {run_id}")
    return 0


def _doctor(store: Store, fix: bool) -> int:
    """Orphan rows per table, or with `fix` removed; status 1 where some are left."""
    found = {table: rows for table, rows in (store.remove_orphans() if fix else store.orphans()).items() if rows}
    if not found:
        print(f"no orphan rows in {store.path}")
        return 0
    print(f"removed orphan rows from {store.path}:" if fix else f"orphan rows in {store.path}:")
    for table, rows in found.items():
        print(f"  {table}: {rows}")
    if fix:
        return 0
    print("give --fix to remove them")
    return 1
