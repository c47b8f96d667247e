"""Our greedy loops against speculative loops and peer decoders, timed end to end on the same clips in one process,
every arm through the pipeline, every ratio against the fastest greedy loop of ours on the device, with a second copy
of our first greedy loop timed beside them: the A/A check."""

from dataclasses import dataclass, field, replace

import pandas as pd
from tqdm import tqdm

from specasr.audio import Clip
from specasr.graphs import StepCost, compiled_graphs
from specasr.intervals import AA_TOLERANCE, Interval, aa_table
from specasr.metrics import acceptance, loop_costs, passes_per_round, predicted_round_speedup, rho
from specasr.pipeline import Pipeline
from specasr.pooled import arm_columns, clip_results, speeds
from specasr.precision import token_agreement
from specasr.store import Store
from specasr.trace import Settings, Trace


@dataclass
class ArmResult:
    """Every decode of one arm: clip by clip, repetition by repetition."""

    settings: Settings
    traces: list[Trace] = field(default_factory=list)
    repeats: list[int] = field(default_factory=list)
    steps: dict[str, StepCost] = field(default_factory=dict)  # its static steps, replayed back to back
    plain_steps: dict[str, StepCost] = field(default_factory=dict)  # a compiled arm's steps, uncompiled
    compile_seconds: float = 0.0  # torch.compile's work on its steps, in its warm-up decode
    recompiles: int = 0  # graphs torch.compile made during its timed decodes (a compiled arm should make none)
    pass_costs: tuple[float, float] | None = None  # a speculative arm's v(N) and rho(W), in target steps
    float32_agreement: tuple[float, int] | None = None  # token share, clips alike: against float32 greedy
    copy_of: str | None = None  # the arm this one times again (the A/A check)

    def speeds(self, baseline: "ArmResult") -> dict[str, Interval]:
        """The baseline's time over this arm's, per phase, with its interval (pooled.speeds)."""
        return speeds(arm_columns(clip_results(baseline.traces, self.traces)))


def _ours_greedy(settings: Settings) -> bool:
    return settings.draft is None and settings.decoder == "specasr"


def benchmark(
    pipeline: Pipeline, arms: dict[str, Settings], clips: list[Clip], repeats: int = 5, progress: type[tqdm] = tqdm
) -> tuple[pd.DataFrame, dict[str, ArmResult]]:
    """Decode every clip `repeats` times in every arm, interleaved, after one warm-up decode per arm.

    `arms` maps names to settings: speculative loops, peers, and our greedy loop, captured and eager where the
    device replays captured steps; the fastest greedy arm of ours (pooled decode time) is the baseline of every
    ratio. A copy of the first greedy arm of ours, "NAME (A/A)", is timed last in every turn (aa_check), and is never
    the baseline. No arm records verification peaks: the loop is timed, not the trace's diagnostics. After the timing,
    each arm's captured steps are timed alone, and arms in another precision are checked against float32 greedy.
    Returns one row per clip and arm, the baseline included (medians over repetitions), and every arm's decodes.
    progress: the bar class that reports each phase (tqdm's interface; the dashboard draws it on the page).
    """
    greedy_arms = [name for name, settings in arms.items() if _ours_greedy(settings)]
    if not greedy_arms:
        raise ValueError("a bench needs our greedy loop among its arms: the baseline")
    arms = {name: replace(settings, verify_peaks=False) for name, settings in arms.items()}
    results = {name: ArmResult(pipeline.resolved(settings)) for name, settings in arms.items()}
    for name, settings in progress(arms.items(), desc="warm-up", unit="arms"):
        compiled = pipeline.compile_seconds()
        pipeline.decode(clips[0], settings)
        results[name].compile_seconds = pipeline.compile_seconds() - compiled
    copy = f"{greedy_arms[0]} (A/A)"
    arms[copy] = arms[greedy_arms[0]]
    results[copy] = ArmResult(results[greedy_arms[0]].settings, copy_of=greedy_arms[0])
    with progress(total=len(clips) * repeats * len(arms), desc="timed", unit="decodes") as bar:
        for clip in clips:
            for repeat in range(repeats):
                for name, settings in arms.items():
                    graphs_before = compiled_graphs()
                    trace = pipeline.decode(clip, settings)
                    results[name].traces.append(trace)
                    results[name].repeats.append(repeat)
                    results[name].recompiles += compiled_graphs() - graphs_before
                    bar.set_postfix_str(f"{clip.id}, {name}: {trace.brief}", refresh=False)
                    bar.update()
    for name, settings in progress(arms.items(), desc="step costs", unit="arms"):
        results[name].steps = pipeline.step_costs(clips[0], settings)
        if results[name].settings.compile:
            results[name].plain_steps = pipeline.step_costs(clips[0], settings, compiled=False)
        if settings.draft is not None:
            results[name].pass_costs = pipeline.pass_costs(clips[len(clips) // 2], settings)
    if any(result.settings.dtype != "float32" for result in results.values()):
        _check_against_float32(pipeline, clips, results, progress)
    baseline = min(greedy_arms, key=lambda name: sum(t.timings.decode for t in results[name].traces))
    by_arm = {name: clip_results(results[baseline].traces, result.traces) for name, result in results.items()}
    rows = []
    for per_arm in zip(*by_arm.values(), strict=True):  # clip by clip, every arm
        for name, clip in zip(by_arm, per_arm, strict=True):
            row = {"clip_id": clip.trace.clip_id, "arm": name, "baseline": baseline, "tokens": len(clip.trace.tokens)}
            rows.append(row | clip.medians() | {"same_tokens": clip.lossless})
    table = pd.DataFrame(rows)
    table["decode_speedup"] = table.greedy_decode / table.decode
    table["total_speedup"] = table.greedy_total / table.total
    return table, results


def _check_against_float32(
    pipeline: Pipeline, clips: list[Clip], results: dict[str, ArmResult], progress: type[tqdm]
) -> None:
    """Each arm's first repetition against our float32 greedy loop on the same clips (paper A.4): the share of
    transcript positions that hold the same token, and the clips decoded alike."""
    arm = next(iter(results.values())).settings
    reference = Settings(target=arm.target, device=arm.device, dtype="float32", verify_peaks=False)
    truth = {
        clip.hash: pipeline.decode(clip, reference).tokens
        for clip in progress(clips, desc="float32 greedy", unit="clips")
    }
    for result in results.values():
        first = [t for t, repeat in zip(result.traces, result.repeats, strict=True) if repeat == 0]
        counts = [token_agreement(truth[t.clip_hash], t.tokens) for t in first]
        alike = sum(truth[t.clip_hash] == t.tokens for t in first)
        result.float32_agreement = sum(same for same, _ in counts) / max(1, sum(n for _, n in counts)), alike


def summary(table: pd.DataFrame, results: dict[str, ArmResult]) -> pd.DataFrame:
    """One row per arm: speedups over the baseline, the fastest greedy loop of ours (median over clips, and pooled
    over time with its 95% interval, paired with the baseline's, taken as every speed figure is: pooled.speeds),
    seconds per clip, decode-phase tokens per second and milliseconds per token, clips with the baseline's tokens
    and, for speculative arms, acceptance, rho (a draft pass over a verification, in the loop), the cost model's
    decode speedup (1 + L) / (v(N) + K rho(W)), to hold against the measured one: v(N) a verification of the arm's N
    nodes and rho(W) a draft pass over its frontier of W rows, each timed alone in target steps of one row
    (profiling.pass_costs), K the rounds' mean draft passes; and what the model leaves out: a verification pass in
    the loop in greedy steps, the share of the decode phase outside draft and verification passes, and the model's
    speedup with that share put back.

    Where an arm decodes with static steps (a greedy step, or a round's drafting and verification): each step's
    device time alone and the kernels it launches (graphs.step_costs), the decode phase's wall time per step (per
    token, or per round; from the medians over repetitions, as every time here), and the host's share of it. Where
    they are compiled: the seconds torch.compile took in the arm's warm-up (none where an arm before it compiled the
    same steps), the graphs it compiled while timed (none, unless a clip's shapes made a step recompile), and the same
    steps' time and kernels uncompiled.
    Where arms ran in another precision: each arm's agreement with float32 greedy.

    Acceptance is counted on the first repetition (every repetition decodes the same tokens); the costs on all of
    them.
    """
    baseline = table.baseline.iloc[0]
    greedy = results[baseline].traces
    rows = []
    for name, runs in table.groupby("arm", sort=False):
        result = results[name]
        first = [t for t, repeat in zip(result.traces, result.repeats, strict=True) if repeat == 0]
        decode, tokens = runs.decode.sum(), runs.tokens.sum()  # of the medians over repetitions
        row = {
            "arm": name,
            "baseline": name == baseline,
            "clips": len(runs),
            "decode_speedup_median": runs.decode_speedup.median(),
            "total_speedup_median": runs.total_speedup.median(),
            "decode_speedup_pooled": runs.greedy_decode.sum() / runs.decode.sum(),
            "total_speedup_pooled": runs.greedy_total.sum() / runs.total.sum(),
            "total_ms_median": 1000 * runs.total.median(),
            "tokens_per_second": tokens / decode,
            "ms_per_token": 1000 * decode / tokens,
            "same_tokens_clips": int(runs.same_tokens.sum()),
        }
        for phase, pooled in result.speeds(results[baseline]).items():
            row |= {f"{phase}_speedup_low": pooled.low, f"{phase}_speedup_high": pooled.high}
        if result.float32_agreement is not None:
            row |= dict(zip(("float32_token_agreement", "float32_same_clips"), result.float32_agreement, strict=True))
        if result.settings.compile:
            row |= {"compile_s": result.compile_seconds, "recompiles": result.recompiles}
        if result.steps:
            steps = sum(len(t.rounds) for t in first) if result.settings.draft is not None else tokens
            row |= _step_columns(result.steps, "device")
            row["wall_ms"] = 1000 * decode / steps
            row["host_share"] = 1 - row["device_ms"] / row["wall_ms"]
        if result.plain_steps:
            row |= _step_columns(result.plain_steps, "plain")
        if result.settings.draft is not None:
            accepted, measured_rho = acceptance(first), rho(result.traces)
            row |= {"L": accepted.L, "a1": accepted.a1, "a2c": accepted.a2c, "rho": measured_rho}
            verification, draft_pass = result.pass_costs
            model = predicted_round_speedup(accepted.L, passes_per_round(result.traces), draft_pass, verification)
            costs = loop_costs(result.traces, greedy)
            row |= {"v": verification, "rho_w": draft_pass, "cost_model_speedup": model}
            row |= {"verify_steps": costs.verify_steps, "outside_share": costs.outside_share}
            row["accounted_speedup"] = costs.accounted_speedup(model)
        rows.append(row)
    return pd.DataFrame(rows)


def _step_columns(steps: dict[str, StepCost], prefix: str) -> dict[str, float]:
    columns = {f"{prefix}_ms_{name}": 1000 * cost.seconds for name, cost in steps.items()}
    columns |= {f"{prefix}_kernels_{name}": cost.kernels for name, cost in steps.items()}
    return columns | {f"{prefix}_ms": 1000 * sum(cost.seconds for cost in steps.values())}


def aa_check(results: dict[str, ArmResult], tolerance: float = AA_TOLERANCE) -> pd.DataFrame:
    """The A/A check (intervals.aa_table): the copied greedy arm's time over its copy's, per phase, with its interval
    over clips. Where it excludes 1 or reaches past 1 +- tolerance, the bench's speed figures are unreliable."""
    copy = next(result for result in results.values() if result.copy_of is not None)
    return aa_table(copy.speeds(results[copy.copy_of]), tolerance).assign(arm=copy.copy_of)


def store_results(store: Store, results: dict[str, ArmResult], command: str) -> dict[str, str]:
    """Each arm's traces as one run of a batch (they were timed side by side); the run ids by arm."""
    run_ids = store.write_runs([(result.traces, result.repeats) for result in results.values()], command)
    return dict(zip(results, run_ids, strict=True))
