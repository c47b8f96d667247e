"""Every measured table of the README and docs/, regenerated from the outputs stored under docs/measurements/.

    python -m scripts.tables          # rewrite each table in place
    python -m scripts.tables --check  # list the tables that differ from their stored outputs; exit 1 if any

A table stands between `<!-- table: NAME -->` and `<!-- /table -->`; NAME is a key of TABLES, whose function
reads the stored output and returns the table's markdown. tests/test_readme.py checks that every table of the
documents is one of these, as regenerated.
"""

import argparse
import json
import re
import sys
from collections.abc import Callable

import numpy as np
import pandas as pd

from scripts.draft_tables import draft_steps_table, levers_table, packed_chain
from scripts.gpu_tables import (
    bench_record,
    compile_decode_table,
    compile_steps_table,
    gpu_float32_table,
    gpu_table,
    gpu_window_table,
    records,
    trees_restart_table,
    trees_table,
)
from scripts.table_format import (
    ANCHOR_2X2,
    BLOCK,
    CPU,
    DOCUMENTS,
    H200,
    ROOT,
    TARGETS,
    aa_line,
    interval,
    markdown,
    number,
    short,
    span,
    speed,
    stored,
    text_section,
    unreliable,
)
from specasr.intervals import pooled_bootstrap
from specasr.pooled import DRAWS, SEED
from specasr.profiling import KINDS

# The README's headline: one row per claim, each linked to its section of docs/measurements.md


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def section(heading: str) -> str:
    """A link to the section of docs/measurements.md under `heading`."""
    return f"[table](docs/measurements.md#{slug(heading)})"


def _best_draft(target: str) -> str:
    """The fastest audio draft of the real loop without a window, and its A/A verdict."""
    record = _experiment(target)
    cells = [c for c in record["cells"] if c["window"] == "unrestricted" and c["draft"] != "no-audio"]
    best = max(cells, key=lambda cell: cell["decode_speedup"])
    return f"{interval(best, 'decode_speedup', 2, unit='x')}{unreliable(record)}, {best['draft']}, L {best['L']:.2f}"


def _peer(target: str, arm: str) -> str:
    record = stored(CPU / f"peers-{target}.json")
    row = next(r for r in record["summary"] if r["arm"] == arm)
    return speed(row, "total", 2) + unreliable(record)


def _gpu_speed(record: dict, arm: str) -> str:
    """An arm's decode speed over the graphed greedy baseline of a GPU bench record, with the interval the runner
    gives today: each clip its median (what the record keeps), clips resampled, paired."""
    clips = [row for row in record["clips"] if row["arm"] == arm]
    arms = [{"seconds": np.array([row[phase] for row in clips])} for phase in ("greedy_decode", "decode")]
    found = pooled_bootstrap(lambda a, b: a["seconds"] / b["seconds"], arms, DRAWS, SEED)
    return span(found.estimate, found.low, found.high, 2, unit="x")


def _gpu_best(target: str) -> str:
    record = stored(H200 / f"float16-{target}.summary.json")
    best = max((r for r in record["summary"] if r.get("L") is not None), key=lambda row: row["decode_speedup_pooled"])
    return f"{_gpu_speed(record, best['arm'])}, {best['arm'].replace(f'{target}/', '')}"


def _gpu_float32(target: str) -> str:
    record = records(H200 / "float32.json")[TARGETS.index(target)]
    return f"{_gpu_speed(record, f'{target}/anchordraft')}, anchordraft K=4"


def _compiled_greedy(target: str) -> str:
    record = bench_record("default", target)
    row = next(r for r in record["summary"] if r["arm"] == "greedy compiled")
    return speed(row, "decode", 2) + unreliable(record)


def _drift(target: str) -> str:
    """The control draft's matched-round L and its anchor error at depth 1 and 4, beside the aligner's floor."""
    record = _matched(target)
    L = next(row["L"] for row in record["summary"] if (row["draft"], row["window"]) == ("control", "unrestricted"))
    depths = {row["depth"]: row["error_frames"] for row in record["depths"]
              if (row["draft"], row["window"]) == ("control", "unrestricted")}  # fmt: skip
    return f"L {L:.2f}; {depths[1]:.1f} -> {depths[4]:.1f} frames (aligner floor {_floor(target):.1f})"


def headline_table() -> str:
    claims = [
        ("greedy WER, 156 clips", lambda t: f"{100 * stored(CPU / f'eval-{t}.json')['wer']:.2f}%",
         "Greedy word error rate"),
        ("CPU: faster-whisper's speed end to end, over our greedy loop", lambda t: _peer(t, "faster-whisper"),
         "Our greedy loop against its peers"),
        ("CPU: fastest shipped draft, K=4, decode speed", _best_draft,
         "The real loop: drafts and windows (Tables 1, 2, 3, 6)"),
        ("CPU: control draft, float16 weights packed, K=4 chain, 20 clips: decode speed, rho", packed_chain,
         "Draft steps on a CPU"),
        ("CPU: matched rounds, control draft: L; anchor error, depth 1 -> 4", _drift,
         "Matched rounds (the paper's C.1 and Table 12)"),
        ("CPU: compiled greedy steps against plain ones", _compiled_greedy, "Compiled steps"),
        ("H200 float16: fastest draft against graphed greedy", _gpu_best, "On a GPU"),
        ("H200 float32: a draft against graphed greedy", _gpu_float32, "On a GPU"),
    ]  # fmt: skip
    rows = [[claim, *(measure(t) for t in TARGETS), section(heading)] for claim, measure, heading in claims]
    return markdown(["", "tiny.en", "base", ""], rows)


# Greedy word error rate and the peers


def wer_table() -> str:
    rows = []
    for target in TARGETS:
        record = stored(CPU / f"eval-{target}.json")
        rows.append([target, str(record["utterances"]), f"{100 * record['wer']:.2f}%"])
    return markdown(["target", "utterances", "WER"], rows)


def peers_table() -> str:
    rows = []
    for target in TARGETS:
        record = stored(CPU / f"peers-{target}.json")
        for row in record["summary"]:
            if row["arm"].endswith("(A/A)"):
                continue
            name = row["arm"].replace(f"{target}/", "") + (" (baseline)" if row["baseline"] else "")
            model = ["", "", "", ""]
            if row.get("L") is not None:
                model = [number(row["L"], 2), number(row["rho"])]
                model += [f"{row[name]:.2f}x" for name in ("cost_model_speedup", "accounted_speedup")]
            speeds = [speed(row, "decode"), speed(row, "total")]
            times = [f"{row['total_ms_median']:.0f}", f"{row['ms_per_token']:.2f}"]
            rows.append([short(target), name, *times, *speeds, f"{row['same_tokens_clips']}/{row['clips']}", *model])
        rows.append([short(target), aa_line(record), *[""] * 9])
    header = ["target", "arm", "median ms a clip, end to end", "decode ms/token", "decode speedup [95%]",
              "end to end [95%]", "our greedy's tokens", "L", "rho", "cost model", "accounted"]  # fmt: skip
    return markdown(header, rows)


def profile_table() -> str:
    rows = []
    for target in TARGETS:
        for row in stored(CPU / f"profile-{target}.json"):
            shares = [f"{100 * row[kind]:.0f}%" for kind in KINDS]
            rows.append([short(target), row["pass"], f"{row['ms']:.2f}", number(row["target_steps"], 2), *shares])
    header = ["target", "pass", "ms", "in target steps", *KINDS]
    return markdown(header, rows)


# The experiment runner (real loop) and matched rounds


def _experiment(target: str) -> dict:
    return stored(CPU / f"experiment-{target}.json")


def experiment_table(target: str) -> Callable[[], str]:
    def table() -> str:
        record = _experiment(target)
        rows = [
            [
                cell["draft"],
                cell["window"],
                number(cell["a1"]),
                number(cell["a2c"]),
                number(cell["L"]),
                interval(cell, "decode_speedup", unit="x"),
                interval(cell, "total_speedup", unit="x"),
                f"{cell['lossless_clips']}/{cell['clips']}",
            ]
            for cell in record["cells"]
        ]
        header = ["draft", "window", "a1", "a2c", "L", "decode speedup [95%]", "end to end [95%]", "lossless"]
        return (
            f"{markdown(header, rows)}\n\n{aa_line(record)}. Sets: {record['aggregation'].split('; within a set')[0]}."
        )

    return table


def peaks_table() -> str:
    """Table 7: each target layer's verification peak against the forced-alignment frames."""
    rows = []
    for target in TARGETS:
        for row in _experiment(target)["peaks"]:
            if not row["source"].endswith("verification"):
                continue
            layer = row["source"].removeprefix("target layer ").removesuffix(" verification")
            name = f"{short(target)}, {layer}" + (" (runtime layer)" if row["runtime_layer"] else "")
            rows.append(
                [
                    name,
                    str(row["tokens"]),
                    number(row["pooled_r"]),
                    number(row["within_r"]),
                    number(row["shuffled_r"]),
                    f"{row['median_error_ms']:.0f} ms",
                    number(row["inside_window"], 2),
                ]
            )
    header = [
        "target, layer",
        "tokens",
        "pooled r",
        "within-utterance r",
        "shuffled r",
        "median error",
        "inside +-400 ms",
    ]
    return markdown(header, rows)


def runtime_table() -> str:
    """Table 16: each runtime window against the uncorrected loops, with the cost rule's verdict, and its window
    centre's error by depth against the aligner's floor."""
    rows = []
    for target in TARGETS:
        floor = _floor(target)
        for row in _experiment(target)["runtime"]:
            rows.append(
                [
                    short(target),
                    row["draft"],
                    f"{row['window']} over {row['uncorrected']}",
                    interval(row, "d_L", sign=True),
                    interval(row, "cost", sign=True),
                    interval(row, "predicted_change", sign=True),
                    row["predicted_pays"],
                    interval(row, "net_decode", sign=True),
                    {True: "yes", False: "no", None: "-"}[row["agrees"]],
                    ", ".join(number(error, 1) for error in row["centre_error_by_depth"]),
                    past_floor(row["centre_error_by_depth"], floor),
                ]
            )
    header = ["target", "draft", "correction", "dL", "dC", "predicted change", "pays", "measured decode change",
              "sign agrees", "centre error by depth, frames", "changes past the floor"]  # fmt: skip
    return markdown(header, rows)


def past_floor(errors: list[float | None], floor: float) -> str:
    """The depths whose error differs from depth 1's by more than the aligner's floor, with the change."""
    changes = [
        (depth, error - errors[0]) for depth, error in enumerate(errors[1:], 2) if None not in (error, errors[0])
    ]
    return ", ".join(f"depth {depth}: {change:+.1f}" for depth, change in changes if abs(change) > floor) or "none"


def _matched(target: str) -> dict:
    return stored(CPU / f"matched-{target}.json")


def matched_table(target: str) -> Callable[[], str]:
    def table() -> str:
        record = _matched(target)
        rows = []
        for row in record["summary"]:
            rows.append(
                [row["draft"], row["window"], str(row["rounds"])]
                + [number(row[m]) for m in ("a1", "a2c", "s2", "s3")]
                + [interval(row, "L")]
            )
        header = ["draft", "window", "rounds", "a1", "a2c", "s2", "s3", "L [95%]"]
        return f"{markdown(header, rows)}\n\nSets: {record['aggregation'].split('; within a set')[0]}."

    return table


def _floor(target: str) -> float:
    """The aligner's floor for the target: its mean token-frame error on synthesized speech, the larger of the
    synthesizers' (real speech is harder still, so a floor is a lower bound on the reference's own error)."""
    floors = stored(CPU / "aligner-floor.json")["floors"]
    return max(row["mean_frames"] for row in floors if row["target"] == target)


def drift_table() -> str:
    """Table 12, top, for the unrestricted window: the mean anchor error by depth, against the aligner's floor; a
    depth's change from depth 1 counts where it is larger than the floor."""
    rows = []
    for target in TARGETS:
        floor = _floor(target)
        depths = pd.DataFrame(_matched(target)["depths"])
        for (draft, window), found in depths.groupby(["draft", "window"], sort=False):
            errors = found.sort_values("depth").error_frames.tolist()
            if window != "unrestricted" or all(e != e for e in errors):
                continue
            rows.append(
                [short(target), draft, *(number(e, 1) for e in errors), f"{floor:.1f}", past_floor(errors, floor)]
            )
    header = ["target", "draft", "depth 1", "depth 2", "depth 3", "depth 4", "aligner floor", "changes past the floor"]
    return markdown(header, rows)


def aligner_floor_table() -> str:
    record = stored(CPU / "aligner-floor.json")
    words = {row["tts"]: row for row in record["words"]}
    rows = []
    for row in record["floors"]:
        spoken = words[row["tts"]]
        rows.append(
            [
                row["tts"],
                short(row["target"]),
                str(row["clips"]),
                str(row["tokens"]),
                number(row["mean_frames"], 2),
                number(row["median_frames"], 1),
                number(row["p90_frames"], 1),
                number(row["within_one_frame"]),
                f"{spoken['median_ms']:.1f} / {spoken['p90_ms']:.1f} ms",
            ]
        )
    header = ["speech", "target", "clips", "tokens", "mean frames", "median", "90th percentile", "within one frame",
              "word starts, median / p90"]  # fmt: skip
    return markdown(header, rows)


# Shipped drafts and issue 34's 2x2


def draft_sizes_table() -> str:
    """Each shipped draft's folder: its shape from its config, its size on disk."""
    rows = []
    for folder in sorted((ROOT / "drafts").glob("*/*/")):
        config = json.loads((folder / "config.json").read_text())
        taps = ", ".join(str(t) for t in config.get("taps", []))
        vocabulary = len(config.get("vocab_ids") or range(config["vocab_size"]))
        shape = f"taps {taps}; feed-forward {config['ffn_dim']}; vocabulary {vocabulary}"
        shape += "" if config.get("audio", True) else "; no audio"
        size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        rows.append([f"`{folder.parent.name}/{folder.name}`", shape, f"{size:.1f} MB"])
    return markdown(["draft", "shape", "size"], rows)


def anchor_2x2_table() -> str:
    path = ANCHOR_2X2 / "dev-set.txt"
    drafts = text_section(path, "Per draft").set_index("draft")
    contrasts = text_section(path, "AnchorDraft - control").set_index(["window", "contrast", "metric"])
    rows = []
    for seed in (0, 1):
        for init, label in (("random", "random"), ("target-layer", "target layer")):
            control, anchor = (drafts.loc[f"{init}-{variant}-s{seed}"] for variant in ("control", "anchordraft"))
            pair = f"{init}-anchordraft-s{seed}-{init}-control-s{seed}"
            L, a3c = (contrasts.loc[("unrestricted", pair, m)] for m in ("L", "a3c"))
            rows.append(
                [
                    f"{label}, {seed}",
                    number(control.L_after),
                    number(anchor.L_after),
                    span(L.estimate, L.low, L.high, sign=True),
                    span(a3c.estimate, a3c.low, a3c.high, sign=True),
                    _headroom(control),
                    _headroom(anchor),
                ]
            )
    header = ["init, seed", "L control", "L AnchorDraft", "AnchorDraft - control, L [95%]", "a3c difference [95%]",
              "headroom control", "headroom AnchorDraft"]  # fmt: skip
    return markdown(header, sorted(rows, key=lambda row: row[0]))


def _headroom(draft: pd.Series) -> str:
    return interval(draft, "headroom_after", sign=True)


TABLES: dict[str, Callable[[], str]] = {
    "headline": headline_table,
    "wer": wer_table,
    "peers": peers_table,
    "profile": profile_table,
    **{f"experiment-{short(t)}": experiment_table(t) for t in TARGETS},
    "peaks": peaks_table,
    "runtime": runtime_table,
    **{f"matched-{short(t)}": matched_table(t) for t in TARGETS},
    "drift": drift_table,
    "aligner-floor": aligner_floor_table,
    "trees": trees_table,
    "trees-restart": trees_restart_table,
    "compile-decode": compile_decode_table,
    "compile-steps": compile_steps_table,
    **{f"gpu-{short(t)}": gpu_table(t) for t in TARGETS},
    "gpu-float32": gpu_float32_table,
    "gpu-window": gpu_window_table,
    "draft-sizes": draft_sizes_table,
    "anchor-2x2": anchor_2x2_table,
    "draft-steps": draft_steps_table,
    "levers": levers_table,
}


def regenerated(text: str) -> str:
    """The document with every table block rewritten from its stored output."""

    def rewrite(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise KeyError(f"no table named {name!r} (scripts/tables.py: TABLES)")
        return f"{match[1]}{TABLES[name]()}\n{match[4]}"

    return BLOCK.sub(rewrite, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table is out of date")
    args = parser.parse_args()
    stale = []
    for path in DOCUMENTS:
        text = path.read_text()
        new = regenerated(text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    verb = "out of date" if args.check else "rewritten"
    print("\n".join(f"{path}: {verb}" for path in stale) or "every table matches its stored output")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
