"""Does the anchor loss help a Whisper draft? The 2x2 (initialisation x anchor weight, two seeds) on matched rounds.

Reads a folder of drafts named INIT-VARIANT-sSEED (trained) and INIT-VARIANT-sSEED-init (the same draft before
training), as tools/gpu_2x2.py and `python -m specasr train --epochs 0` leave them, and rolls every one out from
every transcript position of the evaluation clips, unrestricted and under the correct window. Prints, per draft,
L with its interval and the correct-window headroom (L correct - L unrestricted) before and after training (the
paper's Fig. 3d), the trained drafts' anchor error by depth, and AnchorDraft - control at equal initialisation and
seed (utterance intervals), with the two seeds side by side.

    python -m scripts.anchor_2x2 DRAFTS_DIR [--clips 156] [--json OUT.json]
"""

import argparse
import json
from pathlib import Path

import pandas as pd

from specasr.dataset import DEFAULT_SPEECH_DIR, clips_by_set, load_manifest, spread
from specasr.matched import run_matched
from specasr.matched_tables import contrast_table, depth_table, summary_table
from specasr.pipeline import Pipeline
from specasr.pooled import weighting
from specasr.store import Store
from specasr.trace import Settings

INITS = ("random", "target-layer")
VARIANTS = ("control", "anchordraft")
WINDOWS = ["unrestricted", "correct"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", type=Path)
    parser.add_argument("--clips", type=int, default=156)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    names = [f"{i}-{v}-s{s}" for s in range(args.seeds) for i in INITS for v in VARIANTS]
    folders = [str(args.drafts / name) for name in names] + [str(args.drafts / f"{name}-init") for name in names]
    clips, by_set = clips_by_set(spread(load_manifest(DEFAULT_SPEECH_DIR), args.clips))
    sets = weighting(by_set)
    settings = Settings(target="whisper-tiny.en", k=4)
    conditions = run_matched(Pipeline(Store()), settings, folders, WINDOWS, clips, sets, starts="all")

    summary = summary_table(conditions)
    headroom = contrast_table(conditions, (("unrestricted", "correct"),))
    headroom = headroom[headroom.metric == "L"].set_index("draft")
    rows = []
    for name in names:
        row = {"draft": name}
        for stage, label in (("before", f"{name}-init"), ("after", name)):
            cell = summary[(summary.draft == label) & (summary.window == "unrestricted")].iloc[0]
            row |= {f"L_{stage}": cell.L, f"headroom_{stage}": headroom.loc[label, "estimate"]}
            row |= {f"headroom_{stage}_{end}": headroom.loc[label, end] for end in ("low", "high")}
        row |= {"L_after_low": cell.L_low, "L_after_high": cell.L_high, "a1": cell.a1, "a2c": cell.a2c}
        rows.append(row)
    drafts = pd.DataFrame(rows)

    depths = depth_table([c for c in conditions if c.draft in names and c.window == "unrestricted"])
    pairs = tuple((f"{i}-control-s{s}", f"{i}-anchordraft-s{s}") for i in INITS for s in range(args.seeds))
    anchor = contrast_table([c for c in conditions if c.draft in names], pairs, by="draft")
    anchor = anchor[anchor.metric.isin(["L", "s1", "a2c", "a3c"])]

    print(f"whisper-tiny.en, {len(clips)} clips of {DEFAULT_SPEECH_DIR}, K=4; {sets.rule}")
    print("protocol: matched rounds from every transcript position (teacher-forced rollouts)")
    for title, table in (
        ("Per draft: L unrestricted and correct-window headroom, before and after training", drafts),
        ("Anchor error (frames) by depth, trained drafts, unrestricted", depths),
        ("AnchorDraft - control, same init and seed (utterance intervals)", anchor),
    ):
        print(f"\n{title}\n{table.to_string(index=False, float_format='%.3f')}")
    if args.json:
        tables = {"drafts": drafts, "depths": depths, "anchor": anchor, "summary": summary}
        args.json.write_text(json.dumps({k: v.to_dict("records") for k, v in tables.items()}, default=str))


if __name__ == "__main__":
    main()
