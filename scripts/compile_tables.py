"""The README's "Compiled steps, measured" tables, regenerated from the bench outputs stored under
docs/measurements/compile-2026-12-05/ (`bench --json`, default and --compile, per target).

    python -m scripts.compile_tables [FOLDER]
"""

import json
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "compile-2026-12-05"
TARGETS = ("whisper-tiny.en", "whisper-base")
STEPS = {"step": "greedy step", "draft": "drafting, K=4 passes", "verify": "verification, 5 rows"}


def _record(folder: Path, mode: str, target: str) -> dict:
    return json.loads((folder / f"bench-{mode}-{target}.json").read_text())


def _speed(row: dict) -> str:
    return f"{row['decode_speedup_pooled']:.3f}x [{row['decode_speedup_low']:.3f}, {row['decode_speedup_high']:.3f}]"


def decode_table(folder: Path = FOLDER) -> str:
    """Every arm's ms per token and decode speed over the baseline, with compile seconds and recompiles, and each
    run's A/A check with its verdict."""
    lines = [
        "| target | run | arm | ms/token | decode vs baseline [95%] | compile s | recompiles |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for target in TARGETS:
        short = target.removeprefix("whisper-")
        for mode, run in (("default", "default"), ("compile", "`--compile`")):
            record = _record(folder, mode, target)
            for row in record["summary"]:
                if row["arm"].endswith("(A/A)"):
                    continue
                name = row["arm"].replace(f"{target}/", "") + (" (baseline)" if row["baseline"] else "")
                compiled = row.get("compile_s") is not None
                compile_s = f"{row['compile_s']:.1f}" if compiled else ""
                recompiles = str(int(row["recompiles"])) if compiled else ""
                lines.append(
                    f"| {short} | {run} | {name} | {row['ms_per_token']:.2f} | {_speed(row)} | {compile_s} "
                    f"| {recompiles} |"
                )
            aa = record["aa"][0]
            verdict = "reliable" if record["timing"]["aa"]["reliable"] else "**UNRELIABLE**"
            lines.append(
                f"| {short} | {run} | A/A: greedy over its copy | | {aa['ratio']:.3f}x [{aa['low']:.3f}, "
                f"{aa['high']:.3f}] {verdict} | | |"
            )
    return "\n".join(lines)


def step_table(folder: Path = FOLDER) -> str:
    """Each static step of the --compile runs, compiled and plain: device ms and kernels."""
    lines = [
        "| target | step | compiled ms | compiled kernels | plain ms | plain kernels |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for target in TARGETS:
        for row in _record(folder, "compile", target)["summary"]:
            if row["arm"].endswith("(A/A)"):
                continue
            for step, label in STEPS.items():
                if row.get(f"device_ms_{step}") is None:
                    continue
                lines.append(
                    f"| {target.removeprefix('whisper-')} | {label} | {row[f'device_ms_{step}']:.2f} "
                    f"| {int(row[f'device_kernels_{step}'])} | {row[f'plain_ms_{step}']:.2f} "
                    f"| {int(row[f'plain_kernels_{step}'])} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER
    print(decode_table(folder), step_table(folder), sep="\n\n")
