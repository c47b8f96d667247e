"""Markdown tables from `python -m specasr bench --json` records, one record per line (tools/gpu_job.sh): per target
every arm's milliseconds per token, its speedups over the baseline (the fastest greedy loop of ours) with their
intervals, acceptance, the cost model's speedup, the host's share of a captured step and agreement with float32
greedy; each static step's device time and kernels (compiled and plain, where compiled); for one-clip benches, the
phase split.

    python tools/gpu_tables.py BENCH.json [...]
"""

import json
import sys
from pathlib import Path


def number(value, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def arms_table(record: dict) -> list[str]:
    lines = [
        "| arm | ms/token | decode vs baseline | end to end | L | cost model (accounted) | device ms / wall ms a step "
        "| host share | same tokens as baseline | fp32 token agreement |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["summary"]:
        name = f"**{row['arm']}** (baseline)" if row["baseline"] else row["arm"]
        steps = f"{number(row.get('device_ms'))} / {number(row.get('wall_ms'))}" if row.get("device_ms") else "-"
        interval = f"[{number(row['decode_speedup_low'])}, {number(row['decode_speedup_high'])}]"
        model = f"{number(row.get('cost_model_speedup'))}x ({number(row.get('accounted_speedup'))}x)"
        lines.append(
            f"| {name} | {number(row['ms_per_token'], 3)} | {number(row['decode_speedup_pooled'])}x {interval} "
            f"| {number(row['total_speedup_pooled'])}x | {number(row.get('L'))} "
            f"| {model if row.get('cost_model_speedup') else '-'} | {steps} "
            f"| {number(100 * row['host_share'] if row.get('host_share') is not None else None, 0, '%')} "
            f"| {row['same_tokens_clips']}/{row['clips']} | {number(row.get('float32_token_agreement'), 3)} |"
        )
    return lines


def steps_table(record: dict) -> list[str]:
    lines = ["| arm | step | ms | kernels | plain ms | plain kernels | compile s |", "|---|---|---|---|---|---|---|"]
    for row in record["summary"]:
        steps = [
            key.removeprefix("device_kernels_")
            for key, value in row.items()
            if key.startswith("device_kernels_") and value is not None
        ]
        for step in steps:
            plain = [row.get(f"plain_{what}_{step}") for what in ("ms", "kernels")]
            lines.append(
                f"| {row['arm']} | {step} | {number(row[f'device_ms_{step}'], 3)} "
                f"| {number(row[f'device_kernels_{step}'], 0)} | {number(plain[0], 3)} | {number(plain[1], 0)} "
                f"| {number(row.get('compile_s'), 1)} |"
            )
    return lines


def phases_table(record: dict) -> list[str]:
    lines = ["| arm | features ms | encoder ms | decode ms | total ms | tokens |", "|---|---|---|---|---|---|"]
    for row in record["clips"]:
        phases = [1000 * row[phase] for phase in ("features", "encoder", "decode", "total")]
        lines.append(f"| {row['arm']} | {' | '.join(number(p) for p in phases)} | {row['tokens']} |")
    return lines


def main(paths: list[str]) -> None:
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as error:
            print(f"{path}: {error}")
            continue
        for line in filter(None, lines):
            record = json.loads(line)
            clips = {row["clip_id"] for row in record["clips"]}
            run = next(iter(record["runs"].values()), None) if record["runs"] else None
            print(f"\n{path}: {len(clips)} clips{f', first run {run}' if run else ''}")
            print("\n".join(phases_table(record) if len(clips) == 1 else arms_table(record)))
            if any(row.get("device_ms") for row in record["summary"]):
                print("\n" + "\n".join(steps_table(record)))


if __name__ == "__main__":
    main(sys.argv[1:])
