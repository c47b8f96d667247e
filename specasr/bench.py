"""Our greedy loop against speculative loops and peer decoders, timed end to end on the same clips in one process,
every arm through the pipeline."""

import statistics
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
from tqdm import tqdm

from specasr.audio import Clip
from specasr.metrics import acceptance, loop_costs, predicted_round_speedup, proposals_per_round, rho
from specasr.pipeline import Pipeline
from specasr.store import Store
from specasr.trace import Settings, Trace


@dataclass
class ArmResult:
    """Every decode of one arm: clip by clip, repetition by repetition."""

    settings: Settings
    traces: list[Trace] = field(default_factory=list)
    repeats: list[int] = field(default_factory=list)

    def of_clip(self, clip_hash: str) -> list[Trace]:
        return [t for t in self.traces if t.clip_hash == clip_hash]


@dataclass
class ClipTiming:
    clip_id: str
    arm: str
    tokens: int  # the arm's transcript tokens
    greedy_decode: float  # medians over the repetitions, seconds
    greedy_total: float
    decode: float
    total: float
    same_tokens: bool  # every repetition decoded our greedy loop's tokens


def _median(traces: list[Trace], phase: str) -> float:
    return statistics.median(getattr(t.timings, phase) for t in traces)


def benchmark(
    pipeline: Pipeline, arms: dict[str, Settings], clips: list[Clip], repeats: int = 5
) -> tuple[pd.DataFrame, dict[str, ArmResult]]:
    """Decode every clip `repeats` times in every arm, interleaved, after one warm-up decode per arm.

    `arms` maps names to settings; the first must be our greedy loop, the baseline of the others (speculative
    loops and peers). No arm records verification peaks: the loop is timed, not the trace's diagnostics. Returns one
    row per clip and arm, the baseline included (medians over repetitions), and every arm's decodes.
    """
    baseline = next(iter(arms))
    if arms[baseline].draft is not None or arms[baseline].decoder != "specasr":
        raise ValueError("the first arm of a bench is our greedy loop, the baseline")
    arms = {name: replace(settings, verify_peaks=False) for name, settings in arms.items()}
    for settings in arms.values():
        pipeline.decode(clips[0], settings)
    results = {name: ArmResult(pipeline.resolved(settings)) for name, settings in arms.items()}
    for clip in tqdm(clips, desc="bench", unit="clip"):
        for repeat in range(repeats):
            for name, settings in arms.items():
                results[name].traces.append(pipeline.decode(clip, settings))
                results[name].repeats.append(repeat)
    rows = []
    for clip in clips:
        greedy = results[baseline].of_clip(clip.hash)
        for name, result in results.items():
            runs = result.of_clip(clip.hash)
            rows.append(
                ClipTiming(
                    clip_id=clip.id,
                    arm=name,
                    tokens=len(runs[0].tokens),
                    greedy_decode=_median(greedy, "decode"),
                    greedy_total=_median(greedy, "total"),
                    decode=_median(runs, "decode"),
                    total=_median(runs, "total"),
                    same_tokens=all(s.tokens == greedy[0].tokens for s in runs),
                )
            )
    table = pd.DataFrame([asdict(r) for r in rows])
    table["decode_speedup"] = table.greedy_decode / table.decode
    table["total_speedup"] = table.greedy_total / table.total
    return table, results


def summary(table: pd.DataFrame, results: dict[str, ArmResult]) -> pd.DataFrame:
    """One row per arm: speedups over our greedy loop (median over clips and pooled over time), seconds per clip,
    decode-phase tokens per second, clips with our greedy's tokens and, for speculative arms, acceptance, rho, the
    cost model's decode speedup (1 + L) / (1 + K rho) with K the rounds' mean proposals, to hold against the measured
    one, and what the model leaves out: a verification pass in greedy steps, the share of the decode phase outside
    draft steps and verification passes, and the model's speedup with both put back.

    Acceptance is counted on the first repetition (every repetition decodes the same tokens); the costs on all of
    them.
    """
    greedy = next(iter(results.values())).traces
    rows = []
    for name, runs in table.groupby("arm", sort=False):
        result = results[name]
        row = {
            "arm": name,
            "clips": len(runs),
            "decode_speedup_median": runs.decode_speedup.median(),
            "total_speedup_median": runs.total_speedup.median(),
            "decode_speedup_pooled": runs.greedy_decode.sum() / runs.decode.sum(),
            "total_speedup_pooled": runs.greedy_total.sum() / runs.total.sum(),
            "total_ms_median": 1000 * runs.total.median(),
            "tokens_per_second": runs.tokens.sum() / runs.decode.sum(),
            "same_tokens_clips": int(runs.same_tokens.sum()),
        }
        if result.settings.draft is not None:
            first = [t for t, repeat in zip(result.traces, result.repeats, strict=True) if repeat == 0]
            accepted, measured_rho = acceptance(first), rho(result.traces)
            row |= {"L": accepted.L, "a1": accepted.a1, "a2c": accepted.a2c, "rho": measured_rho}
            model = predicted_round_speedup(accepted.L, proposals_per_round(result.traces), measured_rho)
            costs = loop_costs(result.traces, greedy)
            row |= {"cost_model_speedup": model, "verify_steps": costs.verify_steps}
            row |= {"outside_share": costs.outside_share, "accounted_speedup": costs.accounted_speedup(model)}
        rows.append(row)
    return pd.DataFrame(rows)


def store_results(store: Store, results: dict[str, ArmResult], command: str) -> dict[str, str]:
    """Each arm's traces as one run of a batch (they were timed side by side); the run ids by arm."""
    run_ids = store.write_runs([(result.traces, result.repeats) for result in results.values()], command)
    return dict(zip(results, run_ids, strict=True))
