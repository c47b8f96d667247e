"""Matched rounds' tables (paper C.1, Table 12): each clip's rollouts under one condition, and per condition and
depth the survival, conditional acceptance, anchor errors and restart acceptance, with paired bootstrap intervals
resampling clips within their set."""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from specasr.intervals import Interval, pooled_bootstrap
from specasr.metrics import odds_ratio, outcome_counts
from specasr.pooled import DRAWS, LARGE_ERROR_MS, METRICS, SEED, survival

MATCHED_CONTRASTS = (("unrestricted", "correct"), ("unrestricted", "shift"), ("shift", "correct"))  # (a, b): b - a


@dataclass(frozen=True)
class Rollouts:
    """One clip's matched rounds under one condition: arrays over (rounds, depths) along each round's spine (as
    `specasr.trace.spine` reads a round: its accepted path, then the draft's most probable node; a chain's
    proposals), and the draft's restart candidates."""

    clip_hash: str
    group: str  # the set it is weighted in
    starts: np.ndarray  # (R,) transcript tokens verified before each round
    tokens: np.ndarray  # (R, K) the spine's token; -1 past a spine that ends above depth K
    accepted: np.ndarray  # (R, K) the spine's node at depth d is accepted
    draft_peaks: np.ndarray  # (R, K) frame of the draft's attention peak; -1 without audio attention or a node
    centres: np.ndarray  # (R, K) the window's centre; -1 for none
    reference: np.ndarray  # (R, K) the reference frame of the token at depth d; -1 where unknown
    restarts: np.ndarray  # (R, W) the transcript's token is among the draft's m most probable restarts, m = 1..W
    frame_ms: float

    @property
    def reached(self) -> np.ndarray:
        """(R, K) proposals made while every earlier one of their round stood: the loop's own proposals."""
        survived = np.cumprod(self.accepted, axis=1).astype(bool)
        return np.concatenate([np.ones_like(survived[:, :1]), survived[:, :-1]], axis=1) & (self.tokens >= 0)


def clip_columns(rollouts: list[Rollouts]) -> dict[str, np.ndarray]:
    """Per clip (rows): rounds surviving each depth 0..K, and per depth the reached proposals, their anchor errors
    (sum and count, in frames) and their outcome counts (metrics.outcome_counts); rounds whose transcript token is
    among the draft's m most probable restarts, m = 1..W."""
    survivors, reached, error_sum, error_count, outcomes = [], [], [], [], []
    for r in rollouts:
        survived = np.cumprod(r.accepted, axis=1)
        survivors.append([len(r.starts), *survived.sum(axis=0)])
        reached.append(r.reached.sum(axis=0))
        known = r.reached & (r.reference >= 0) & (r.draft_peaks >= 0)
        error = np.abs(r.draft_peaks - r.reference)
        error_sum.append(np.where(known, error, 0).sum(axis=0))
        error_count.append(known.sum(axis=0))
        outcomes.append(
            [
                outcome_counts(error[known[:, d], d] * r.frame_ms, r.accepted[known[:, d], d], LARGE_ERROR_MS)
                for d in range(r.accepted.shape[1])
            ]
        )
    return {
        "survivors": np.array(survivors, dtype=float),
        "reached": np.array(reached, dtype=float),
        "restarts": np.array([r.restarts.sum(axis=0) for r in rollouts], dtype=float),
        "error_sum": np.array(error_sum, dtype=float),
        "error_count": np.array(error_count, dtype=float),
        "outcomes": np.array(outcomes, dtype=float),
    }


def conditional(depth: int) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """a_k^c = s_k / s_{k-1}."""
    return lambda sums: sums["survivors"][..., depth] / sums["survivors"][..., depth - 1]


def restart(candidates: int) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """a1(m): the share of rounds whose transcript token is among the draft's m most probable restarts."""
    return lambda sums: sums["restarts"][..., candidates - 1] / sums["survivors"][..., 0]


@dataclass(frozen=True)
class Condition:
    """One draft under one window and draft tree, rolled out from the same rounds as every other condition of its
    draft."""

    draft: str
    window: str
    width: int  # the draft tree's width (1: a chain)
    nodes: int  # tree nodes verified per round
    rollouts: list[Rollouts]
    resample_sets: bool = True  # intervals resample the sets too (`Weighting.resample_sets`)

    @property
    def name(self) -> dict[str, str | int]:
        """What a table row names it by."""
        return {"draft": self.draft, "window": self.window, "width": self.width, "nodes": self.nodes}

    @cached_property
    def columns(self) -> dict[str, np.ndarray]:
        """Its clip columns, built once for every metric and depth taken of them."""
        return clip_columns(self.rollouts)

    @property
    def strata(self) -> list[str]:
        return [r.group for r in self.rollouts]


def _interval(statistic: Callable[..., np.ndarray], arms: list[Condition]) -> Interval:
    columns = [arm.columns for arm in arms]
    first = arms[0]
    return pooled_bootstrap(statistic, columns, DRAWS, SEED, strata=first.strata, resample_strata=first.resample_sets)


def _estimate(metric: Callable[..., np.ndarray], condition: Condition) -> float | None:
    try:
        return pooled_bootstrap(metric, [condition.columns], 0, strata=condition.strata).estimate
    except ValueError:
        return None


def depth_table(conditions: list[Condition]) -> pd.DataFrame:
    """Table 12, top: per condition and depth, the reached proposals' mean anchor error (frames), s_k and a_k^c."""
    rows = []
    for c in conditions:
        sums = {name: column.sum(axis=0) for name, column in c.columns.items()}
        survivors = sums["survivors"]
        for depth in range(1, len(survivors)):
            count = sums["error_count"][depth - 1]
            rows.append(
                c.name
                | {
                    "depth": depth,
                    "reached": int(sums["reached"][depth - 1]),
                    "error_frames": sums["error_sum"][depth - 1] / count if count else None,
                    "s": _estimate(survival(depth), c),
                    "a_c": _estimate(conditional(depth), c),
                }
            )
    return pd.DataFrame(rows)


def summary_table(conditions: list[Condition]) -> pd.DataFrame:
    """Per condition: rounds, a1, a2c, s2, s3 and L, each with its interval."""
    rows = []
    metrics = {"a1": METRICS["a1"], "a2c": METRICS["a2c"], "s2": survival(2), "s3": survival(3), "L": METRICS["L"]}
    for c in conditions:
        row = c.name | {"clips": len(c.rollouts)}
        row["rounds"] = int(sum(len(r.starts) for r in c.rollouts))
        for name, metric in metrics.items():
            try:
                found = _interval(metric, [c])
            except ValueError:  # beyond K
                continue
            row |= {name: found.estimate, f"{name}_low": found.low, f"{name}_high": found.high}
        rows.append(row)
    return pd.DataFrame(rows)


def contrast_table(conditions: list[Condition], pairs=MATCHED_CONTRASTS, by: str = "window") -> pd.DataFrame:
    """Paired contrasts b - a, clip by clip: s_k and a_k^c by depth, and L; between windows at equal audio draft (from
    the same rounds), or with by="draft" between drafts at equal window (the same rounds where starts are every
    position; with the loop's starts each draft keeps its own)."""
    held = "draft" if by == "window" else "window"
    if by == "window":  # a window changes nothing for a draft that does not attend to the audio
        conditions = [c for c in conditions if any((r.draft_peaks >= 0).any() for r in c.rollouts)]
    by_key = {(getattr(c, held), getattr(c, by)): c for c in conditions}
    rows = []
    for fixed in dict.fromkeys(getattr(c, held) for c in conditions):
        for a, b in pairs:
            if (fixed, a) not in by_key or (fixed, b) not in by_key:
                continue
            arms = [by_key[fixed, a], by_key[fixed, b]]
            depths = arms[0].rollouts[0].accepted.shape[1] if arms[0].rollouts else 0
            metrics = {"L": (None, METRICS["L"])}
            for depth in range(1, depths + 1):
                metrics[f"s{depth}"] = (depth, survival(depth))
                if depth > 1:  # a1c is s1
                    metrics[f"a{depth}c"] = (depth, conditional(depth))
            for name, (depth, metric) in metrics.items():
                try:
                    found = _interval(lambda x, y, m=metric: m(y) - m(x), arms)
                except ValueError:  # no round reaches this depth in one arm
                    continue
                rows.append({held: fixed, "contrast": f"{b}-{a}", "metric": name, "depth": depth, **asdict(found)})
    return pd.DataFrame(rows).astype({"depth": "Int64"}) if rows else pd.DataFrame()


def outcome_table(conditions: list[Condition]) -> pd.DataFrame:
    """Table 12, bottom: per condition and depth, the reached proposals' median anchor error (frames) when accepted
    and when rejected, and the odds ratio of an error over 200 ms at rejection over acceptance, with its interval."""
    rows = []
    for c in conditions:
        depths = c.rollouts[0].accepted.shape[1] if c.rollouts else 0
        for depth in range(1, depths + 1):
            errors, outcomes = _errors_at(c.rollouts, depth)
            if not outcomes.any() or outcomes.all():
                continue
            try:
                ratio = _interval(lambda sums, d=depth: odds_ratio(sums["outcomes"][..., d - 1, :]), [c])
            except ValueError:  # an empty cell in most draws
                ratio = Interval(float("nan"), float("nan"), float("nan"))
            rows.append(
                c.name
                | {
                    "depth": depth,
                    "accepted": int(outcomes.sum()),
                    "rejected": int((~outcomes).sum()),
                    "accepted_error_frames": float(np.median(errors[outcomes])),
                    "rejected_error_frames": float(np.median(errors[~outcomes])),
                    "odds_ratio": ratio.estimate,
                    "odds_low": ratio.low,
                    "odds_high": ratio.high,
                }
            )
    return pd.DataFrame(rows)


def restart_table(conditions: list[Condition]) -> pd.DataFrame:
    """Restart acceptance with m candidates, m = 1..W, whatever the node budget: a1(m) and, paired on the same
    rounds, its gain over the chain's restart, a1(m) - a1(1)."""
    rows = []
    for c in conditions:
        for m in range(1, c.width + 1):
            try:
                found = _interval(restart(m), [c])
            except ValueError:  # no rounds
                continue
            row = c.name | {"m": m, "a1": found.estimate, "a1_low": found.low, "a1_high": found.high}
            if m > 1:
                gain = _interval(lambda sums, m=m: restart(m)(sums) - restart(1)(sums), [c])
                row |= {"gain": gain.estimate, "gain_low": gain.low, "gain_high": gain.high}
            rows.append(row)
    return pd.DataFrame(rows)


def _errors_at(rollouts: list[Rollouts], depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The reached proposals at `depth` with a known anchor error: errors in frames and whether each was accepted."""
    errors, outcomes = [], []
    for r in rollouts:
        known = r.reached[:, depth - 1] & (r.reference[:, depth - 1] >= 0) & (r.draft_peaks[:, depth - 1] >= 0)
        errors.append(np.abs(r.draft_peaks - r.reference)[known, depth - 1])
        outcomes.append(r.accepted[known, depth - 1])
    return np.concatenate(errors), np.concatenate(outcomes)
