"""The tables of issue 56's runs on a CPU: each draft precision in the loop, and each training lever's draft (from
their stored outputs; scripts/tables.py puts them in the documents)."""

import itertools
import json
from pathlib import Path

from scripts.table_format import (
    DRAFT_STEPS,
    TARGETS,
    aa_line,
    markdown,
    number,
    short,
    speed,
    stored,
    unreliable,
)

PRECISIONS = ("float32", "float16")


def draft_steps_table() -> str:
    """Each draft precision's bench: our greedy loop (the baseline), the chain and a tree, with the run's A/A."""
    rows = []
    for target in TARGETS:
        for weights in PRECISIONS:
            record = stored(DRAFT_STEPS / f"bench-{target}-{weights}.json")
            for row in record["summary"]:
                if row["arm"].endswith("(A/A)") or row["arm"] == "greedy compiled":
                    continue
                drafted = row.get("L") is not None
                arm = row["arm"].replace(f"{target}/", "") + (" (baseline)" if row["baseline"] else "")
                costs = [number(row["L"]), number(row["rho"]), number(row["rho_w"])] if drafted else ["", "", ""]
                rows.append([short(target), weights, arm, *costs, f"{row['ms_per_token']:.2f}", speed(row, "decode")])
            rows.append([short(target), weights, aa_line(record), "", "", "", "", ""])
    header = [
        "target",
        "draft weights",
        "arm",
        "L",
        "rho in the loop",
        "rho alone",
        "ms/token",
        "decode vs greedy [95%]",
    ]
    return markdown(header, rows)


def packed_chain(target: str) -> str:
    """The headline's cell: the control chain with float16 weights packed for fbgemm, its speed and rho."""
    record = stored(DRAFT_STEPS / f"bench-{target}-float16.json")
    chain = next(row for row in record["summary"] if row["arm"] == f"{target}/control K=4")
    return f"{speed(chain, 'decode', 2)}{unreliable(record)}, rho {chain['rho']:.3f}"


def levers_table() -> str:
    """Each lever's draft on the clips no draft trained on: acceptance at K=4 and its vocabulary's reach, for every
    target whose lever study is stored; the shipped draft, which every study of its target evaluates, is listed once."""
    studies = [stored(path) for path in sorted(DRAFT_STEPS.glob("levers-*.json"))]
    rows = []
    for target, data in itertools.product(TARGETS, ("speech", "heldout")):
        for record in (study for study in studies if study["target"] == target):
            for row in record[data]:
                cells = [
                    short(target),
                    data,
                    row["row"],
                    training(record, row["row"]),
                    number(row["a1"]),
                    number(row["a2c"]),
                    number(row["L"]),
                    f"{100 * row['in_vocabulary']:.1f}%",
                    f"{row['lossless_clips']}/{row['clips']}",
                ]
                if cells not in rows:
                    rows.append(cells)
    header = ["target", "clips", "draft", "trained on", "a1", "a2c", "L", "greedy tokens in its vocabulary"]
    return markdown([*header, "same tokens as greedy"], rows)


SOURCE_OPTIONS = ("--real", "--real-2", "--espeak", "--hibari", "--perturbed")


def training(record: dict, row: str) -> str:
    """'CLIPS clips x EPOCHS': from the row's train command, or for the shipped draft from its recorded settings."""
    command = record["commands"].get(row)
    if command is None:
        settings = json.loads((Path("drafts") / record["target"] / "control" / "config.json").read_text())["training"]
        clips, epochs = sum(source["count"] for source in settings["sources"].values()), settings["epochs"]
    else:
        pairs = itertools.pairwise(command)
        value = {name: int(value) for name, value in pairs if name.startswith("--") and value.isdigit()}
        clips, epochs = sum(value.get(name, 0) for name in SOURCE_OPTIONS), value["--epochs"]
    return f"{clips:,} clips x {epochs} epochs"
