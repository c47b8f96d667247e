"""The tables of runs on other machines and loops: draft trees, compiled steps and the H200, from their stored
outputs (scripts/tables.py puts them in the documents)."""

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from scripts.table_format import (
    COMPILE,
    H200,
    TARGETS,
    TREES,
    aa_line,
    interval,
    markdown,
    number,
    short,
    span,
    speed,
    stored,
    text_section,
)

# Draft trees (issue 42's runs: their speed intervals resampled repetitions, so only their estimates are shown)


def trees_table() -> str:
    rows = []
    for target in TARGETS:
        path = TREES / f"experiment-{target}.txt"
        cells = text_section(path, "Cells")
        contrasts = text_section(path, "Contrasts", spaced="fixed")
        for cell in cells.to_dict("records"):
            width, nodes = cell["tree_width"], cell["tree_nodes"]
            chain = width == 1
            shape = f"chain (1 x {nodes})" if chain else f"{width} x {nodes}"
            gain = "" if chain else _tree_gain(contrasts, f"tree {width}x{nodes}-chain ")
            rows.append(
                [short(target), shape, number(cell["L"]), gain]
                + [f"{cell[m]:.3f}x" for m in ("decode_speedup", "total_speedup")]
            )
    return markdown(["target", "shape (W x N)", "L", "tree - chain, L [95%]", "decode speedup", "total speedup"], rows)


def _tree_gain(contrasts: pd.DataFrame, name: str) -> str:
    """The tree's L over the chain's: the contrast whose name and fixed settings start with `name`."""
    row = contrasts[contrasts.fixed.str.startswith(name) & (contrasts.metric == "L")].iloc[0]
    return span(row["estimate"], row["low"], row["high"], sign=True)


def trees_restart_table() -> str:
    rows = []
    for target in TARGETS:
        restarts = text_section(TREES / f"matched-restart-{target}.txt", "Restart acceptance").set_index("m")
        gain = interval(restarts.loc[restarts.index.max()], "gain", sign=True)
        rows.append([short(target), *(number(restarts.a1[m]) for m in restarts.index), gain])
    return markdown(["target", "a1(1)", "a1(2)", "a1(3)", "a1(4)", "gain at m = 4 [95%]"], rows)


# Compiled steps (bench --json, default and --compile, per target)

STEPS = {"step": "greedy step", "draft": "drafting, K=4 passes", "verify": "verification, 5 rows"}


def bench_record(mode: str, target: str) -> dict:
    return stored(COMPILE / f"bench-{mode}-{target}.json")


def compile_decode_table() -> str:
    """Every arm's ms per token and decode speed over the baseline, with compile seconds and recompiles, and each
    run's A/A check with its verdict."""
    rows = []
    for target in TARGETS:
        for mode, run in (("default", "default"), ("compile", "`--compile`")):
            record = bench_record(mode, target)
            for row in record["summary"]:
                if row["arm"].endswith("(A/A)"):
                    continue
                name = row["arm"].replace(f"{target}/", "") + (" (baseline)" if row["baseline"] else "")
                compiled = row.get("compile_s") is not None
                rows.append(
                    [short(target), run, name, f"{row['ms_per_token']:.2f}", speed(row, "decode")]
                    + ([f"{row['compile_s']:.1f}", str(int(row["recompiles"]))] if compiled else ["", ""])
                )
            rows.append([short(target), run, aa_line(record), "", "", "", ""])
    header = ["target", "run", "arm", "ms/token", "decode vs baseline [95%]", "compile s", "recompiles"]
    return markdown(header, rows)


def compile_steps_table() -> str:
    """Each static step of the --compile runs, compiled and plain: device ms and kernels."""
    rows = []
    for target in TARGETS:
        for row in bench_record("compile", target)["summary"]:
            if row["arm"].endswith("(A/A)"):
                continue
            for step, label in STEPS.items():
                if row.get(f"device_ms_{step}") is None:
                    continue
                rows.append(
                    [
                        short(target),
                        label,
                        f"{row[f'device_ms_{step}']:.2f}",
                        str(int(row[f"device_kernels_{step}"])),
                        f"{row[f'plain_ms_{step}']:.2f}",
                        str(int(row[f"plain_kernels_{step}"])),
                    ]
                )
    header = ["target", "step", "compiled ms", "compiled kernels", "plain ms", "plain kernels"]
    return markdown(header, rows)


# The H200 (bench --json summaries, recomputed from the run's stored traces)


def gpu_table(target: str) -> Callable[[], str]:
    def table() -> str:
        rows = []
        for row in stored(H200 / f"float16-{target}.summary.json")["summary"]:
            name = row["arm"].replace(f"{target}/", "")
            steps = "-" if not row.get("device_ms") else f"{row['device_ms']:.2f} / {row['wall_ms']:.2f}"
            host = "-" if row.get("host_share") is None else f"{100 * row['host_share']:.0f}%"
            rows.append(
                [
                    f"**{name}** (baseline)" if row["baseline"] else name,
                    f"{row['ms_per_token']:.3f}",
                    f"{row['decode_speedup_pooled']:.2f}x",
                    f"{row['total_speedup_pooled']:.2f}x",
                    number(row.get("L"), 2),
                    steps,
                    host,
                    f"{row['same_tokens_clips']}/{row['clips']}",
                    number(row.get("float32_token_agreement")),
                ]
            )
        header = ["arm", "ms/token", "decode vs baseline", "end to end", "L", "device ms / wall ms a step",
                  "host share", "same tokens as baseline", "float32 token agreement"]  # fmt: skip
        return markdown(header, rows)

    return table


def records(path: Path) -> list[dict]:
    """A GPU job's bench records, one JSON object a line, tiny.en's first."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gpu_float32_table() -> str:
    rows = []
    for target, record in zip(TARGETS, records(H200 / "float32.json"), strict=True):
        arms = {row["arm"].replace(f"{target}/", ""): row for row in record["summary"]}
        greedy, draft = arms["greedy"], arms["anchordraft"]
        rows.append(
            [
                short(target),
                f"{greedy['ms_per_token']:.3f}",
                *(f"{arms[a]['ms_per_token']:.3f} ({arms[a]['decode_speedup_pooled']:.2f}x)" for a in
                  ("greedy eager", "transformers")),
                f"{draft['ms_per_token']:.3f}",
                f"{draft['decode_speedup_pooled']:.2f}x",
                f"{draft['total_speedup_pooled']:.2f}x",
                number(draft["L"], 2),
                f"{100 * draft['host_share']:.0f}%",
            ]
        )  # fmt: skip
    header = ["target", "graphed greedy ms/token", "eager", "`generate`", "anchordraft K=4: ms/token",
              "decode vs graphed greedy", "end to end", "L", "host share of a round"]  # fmt: skip
    return markdown(header, rows)


def gpu_window_table() -> str:
    """One 30 s clip, waveform to text: each arm's phases."""
    rows = []
    for target, record in zip(TARGETS, records(H200 / "long-30s.json"), strict=True):
        for row in record["clips"]:
            phases = [f"{1000 * row[phase]:.2f}" for phase in ("features", "encoder", "decode", "total")]
            rows.append([short(target), row["arm"].replace(f"{target}/", ""), *phases, str(row["tokens"])])
    return markdown(["target", "arm", "features ms", "encoder ms", "decode ms", "total ms", "tokens"], rows)
