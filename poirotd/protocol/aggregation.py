"""Phase V: hazard-aware aggregation of the private votes. Pure functions, numpy, no I/O.

Agent i sits at position p_i (one-hot at its own region); its vote v_i weighs
w_i = β_i + ½(1 - d_H(p_i, v_i)/N), so self-attribution counts most and no vote counts less than
β_i; the attribution is S_j = Σ_i w_i v_ij. β is one number (the paper's default 0.25) or one per
agent (the reputation variant). Abstentions carry no vector and are left out, never read as
zeros. Ties are reported, never broken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from poirotd.config.spec import DecisionRuleSpec
from poirotd.model import Attribution, HazardSpace, Vote

Floats = npt.NDArray[np.float64]
Bits = npt.NDArray[np.int64]

TIE_TOLERANCE = 1e-9


def positions(space: HazardSpace, agent_ids: Sequence[str]) -> Bits:
    """One row per agent, one-hot at the agent's own region."""
    rows = np.zeros((len(agent_ids), space.size), dtype=np.int64)
    for row, agent_id in enumerate(agent_ids):
        rows[row, space.index_of(agent_id)] = 1
    return rows


def weights(positions: npt.ArrayLike, locations: npt.ArrayLike, beta: npt.ArrayLike) -> Floats:
    """w_i = β_i + ½(1 - d_H(p_i, v_i)/N) for each row i; `beta` is a scalar or one per row."""
    p, v = np.asarray(positions, dtype=np.int64), np.asarray(locations, dtype=np.int64)
    if p.shape != v.shape or p.ndim != 2:
        raise ValueError(f"positions {p.shape} and locations {v.shape} must be the same (A, N)")
    distance = np.count_nonzero(p != v, axis=1)
    w: Floats = np.asarray(beta, dtype=np.float64) + 0.5 * (1.0 - distance / v.shape[1])
    return w


def score(
    positions: npt.ArrayLike,
    locations: npt.ArrayLike,
    beta: npt.ArrayLike,
    rule: DecisionRuleSpec,
) -> tuple[Floats, Attribution]:
    """Weights and attribution from explicit (A, N) positions and votes of the valid voters.

    `Attribution.beta` is β, or the mean of the β_i when they differ per agent.
    """
    v = np.asarray(locations, dtype=np.int64)
    w = weights(positions, v, beta)
    scores = w @ v
    top, decision = decide(scores, rule)
    betas = np.asarray(beta, dtype=np.float64)
    attribution = Attribution(
        scores=tuple(float(s) for s in scores),
        top=top,
        tie=len(top) > 1,
        decision=decision,
        rule=rule_name(rule),
        beta=float(betas.mean()) if betas.size else 0.0,
    )
    return w, attribution


def decide(scores: Floats, rule: DecisionRuleSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(top, decision): top = every region within TIE_TOLERANCE of the best score; decision =
    the top regions (argmax) or every S_j ≥ τ·max S (threshold). All-zero scores: no anomaly."""
    best = float(scores.max()) if scores.size else 0.0
    if best <= 0.0:
        return (), (0,) * scores.size
    at_top = scores >= best - TIE_TOLERANCE
    chosen = at_top if rule.rule == "argmax" else scores >= rule.tau * best - TIE_TOLERANCE
    return tuple(int(j) for j in np.flatnonzero(at_top)), tuple(int(x) for x in chosen)


def rule_name(rule: DecisionRuleSpec) -> str:
    return "argmax" if rule.rule == "argmax" else f"threshold(tau={rule.tau:g})"


def weigh(space: HazardSpace, vote: Vote, beta: float) -> Vote:
    """The vote with its weight, which depends only on the voter's own position and vector."""
    if vote.abstained:
        return vote
    w = weights(positions(space, [vote.agent_id]), [vote.location], beta)
    return vote.model_copy(update={"weight": float(w[0])})


def aggregate(
    space: HazardSpace,
    votes: Sequence[Vote],
    beta: float | Mapping[str, float],
    rule: DecisionRuleSpec,
) -> Attribution:
    """The attribution over the votes that are not abstentions; `beta` is one β for all or a
    β_i per agent id (the reputation variant)."""
    cast = [v for v in votes if not v.abstained]
    locations = np.array([v.location for v in cast], dtype=np.int64).reshape(len(cast), space.size)
    betas = [beta[v.agent_id] for v in cast] if isinstance(beta, Mapping) else beta
    _, attribution = score(positions(space, [v.agent_id for v in cast]), locations, betas, rule)
    return attribution.model_copy(update={"step": consensus_step(cast)})


def consensus_step(votes: Sequence[Vote]) -> int | None:
    """ "When": the step with the highest total weight among the non-abstaining votes that gave
    one; a tie goes to the earliest step (the first sign of a fault); None when none gave one."""
    totals: dict[int, float] = {}
    for v in votes:
        if not v.abstained and v.step is not None:
            totals[v.step] = totals.get(v.step, 0.0) + v.weight
    return heaviest_step(totals)


def heaviest_step(totals: Mapping[int, float]) -> int | None:
    """The step with the highest total weight, the earliest of a tie; None when there is none."""
    if not totals:
        return None
    best = max(totals.values())
    return min(step for step, total in totals.items() if total >= best - TIE_TOLERANCE)
