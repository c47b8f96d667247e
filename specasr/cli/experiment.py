"""experiment: a grid of drafts x windows x K x draft trees x thresholds, timed and kept in the store, and the paper's
tables; the tables are printed (and written to --out) whatever the store does."""

import argparse
import json

from specasr.cli.options import (
    add_clip_options,
    add_data_options,
    add_out_options,
    add_speculative_options,
    add_store_options,
    add_timing_options,
    checked,
    data_files,
    drafts,
    evaluation_clips,
    fits_target,
    number,
    out_file,
    settings,
    trees,
)
from specasr.cli.output import Report, RunStore, json_value, records
from specasr.experiments import PROTOCOL, REPEATS, Grid, run_grid
from specasr.intervals import aa_verdict, aa_warning, unreliable_mark
from specasr.pipeline import Pipeline
from specasr.ranks import joined, leave
from specasr.report import AGGREGATION, repetition_note, tables


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("experiment", help="a grid of drafts x windows x K x trees x thresholds, kept in the store")
    add_data_options(p, sets=True)
    p.add_argument(
        "--repeats",
        type=number(int, 1),
        default=REPEATS,
        help=f"timing repetitions per clip, interleaved; a clip's time is their median (under {REPEATS}: a warning)",
    )
    add_clip_options(p)
    add_speculative_options(p, several_drafts=True, grid=True)
    add_store_options(p, optional=False)
    add_out_options(p)
    add_timing_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with cells and contrasts")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report, grid = Report(out_file(args, data_files(str(args.data)))), _grid(args)
    clips, sets = evaluation_clips(args)
    ranks = joined()  # under torchrun, the first rank keeps the store and prints; every rank decodes a share
    kept = RunStore(args.db, wanted=ranks.first)  # the grid reuses and completes its batches; without it, decodes all
    runs = run_grid(Pipeline(kept.store), kept.store, grid, clips, args.repeats, ranks=ranks)
    leave()
    if runs is None:
        return 0
    found = tables(kept.store, runs, sets, args.aa_tolerance)  # from the decodes in `runs`: no store needed
    aggregation = f"{sets.rule}; {AGGREGATION}"
    best = found.cells.loc[found.cells.decode_speedup.idxmax()]
    warnings = {"aa_warning": aa_warning(found.aa), "timing_note": repetition_note(args.repeats)}
    if args.json:
        record = {"protocol": PROTOCOL, "aggregation": aggregation, "baseline_run": runs.baseline}
        record["peaks_run"] = runs.peaks
        record |= {"second_baseline_run": runs.second_baseline, "repeats": args.repeats} | warnings
        record["timing"] = {"aa": aa_verdict(found.aa)}
        record |= {name: records(table) for name, table in vars(found).items()}
        report.print(json.dumps(record | {"best_run": best.run_id}, default=json_value))
    else:
        _print_tables(report, args, clips, runs, found, aggregation, best)
        report.warn(*warnings.values())
    report.save()
    return max(int(report.failed), kept.finish(runs.not_stored))


def _print_tables(report: Report, args: argparse.Namespace, clips, runs, found, aggregation: str, best) -> None:
    report.print(f"{args.target} on {len(clips)} clips of {args.data} x {args.repeats} repeats")
    report.print(f"greedy run {runs.baseline or '(not stored)'}, verification-peaks run {runs.peaks or '(not stored)'}")
    report.print(f"protocol: {PROTOCOL}\n{aggregation}")
    speed = unreliable_mark(found.aa)
    for title, table, number_format in (
        (f"Cells (Tables 1, 2, 3, 6){speed}", found.cells.drop(columns="s"), "%.3f"),
        (f"Contrasts, b-a (Tables 1, 2, 3, 6, 16){speed}", found.contrasts, "%+.3f"),
        ("Attention peaks vs reference frames (Table 7)", found.peaks, "%.3f"),
        ("Restart anchor error by proposal outcome, ms (Table 10)", found.outcomes, "%.3f"),
        (f"Runtime correction vs no window and a shifted one (Table 16){speed}", found.runtime, "%.3f"),
        (f"K, tree and threshold sweep (Table 21){speed}", found.sweep, "%.3f"),
        (f"Cells, set by set (Tables 1, 6){speed}", found.cells_by_set.drop(columns="s", errors="ignore"), "%.3f"),
        ("Restart anchor error by outcome, set by set (Table 10)", found.outcomes_by_set, "%.3f"),
        (f"Runtime correction, set by set (Table 16){speed}", found.runtime_by_set, "%.3f"),
        (f"A/A check: greedy over its second copy (run {runs.second_baseline})", found.aa, "%.3f"),
    ):
        if len(table):
            report.print(f"\n{title}\n{table.to_string(index=False, float_format=number_format)}")
    report.print(
        f"\nfastest cell{speed}: {best.draft} {best.window} K={best.k} tree {best.tree_width}x{best.tree_nodes} "
        f"threshold={best.threshold:g}, "
        f"decode speedup {best.decode_speedup:.3f}x [{best.decode_speedup_low:.3f}, {best.decode_speedup_high:.3f}]"
    )


def _grid(args: argparse.Namespace) -> Grid:
    """The grid, every cell checked before any work. Its base is its first cell: each cell, the baseline and the
    peaks pass replace the draft, the axes and the reference."""
    names = drafts(args)
    shapes = tuple(trees(args))
    (width, nodes), window, k, threshold = shapes[0], args.window[0], args.k[0], args.threshold[0]
    first = settings(args, names[0], window=window, k=k, threshold=threshold, tree_width=width, tree_nodes=nodes)
    grid = Grid(first, tuple(names), args.window, args.k, args.threshold, shapes)
    for cell in checked(grid.cells):
        fits_target(cell)
    return grid
