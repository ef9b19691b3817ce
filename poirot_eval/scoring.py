"""Scores of case results: pure functions over `CaseResult`s, no I/O.

BLAME is scored by exact vector match (every bit of the decision equals the ground truth), split
by the number k of faulty regions. Who&When and TracerTraj are scored by agent (the decision names
exactly the faulty agent) and by step (exact or within ±k messages). Every rate is over all cases
of a group: a run that failed or ran out of context counts as a miss, as in the original Who&When
script, which divides by the number of cases in the dataset.

Agents are matched by region id, exactly. The original Who&When evaluation
(Agents_Failure_Attribution, Automated_FA/evaluate.py) credits a prediction when
``actual_agent in predicted_agent`` and ``actual_step in predicted_step``, both substring tests
on strings: a true "Verification_Expert" is credited for a predicted "DataVerification_Expert"
(any agent whose name is contained in another's), and a true step "1" for a predicted "12".
Numbers from that script can therefore be higher than ours for the same predictions.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from poirot_eval.results import CaseResult
from poirotd.model import Vote

Bits = npt.NDArray[np.int64]

# Step tolerances reported: exact, within one message, within three.
STEP_TOLERANCES = (0, 1, 3)


@dataclass(frozen=True)
class Ratio:
    hits: int
    total: int

    @property
    def value(self) -> float | None:
        return self.hits / self.total if self.total else None


@dataclass(frozen=True)
class Summary:
    """One group of results (one dataset, method and model)."""

    n: int
    ok: int
    context_exceeded: int
    failed: int
    # The decision names exactly the faulty region(s): agent accuracy for single-fault
    # datasets, overall exact-vector accuracy for BLAME.
    attribution: Ratio
    exact_single: Ratio
    exact_multi: Ratio
    # Tolerance -> step accuracy, over the cases whose truth has a step.
    step: dict[int, Ratio]
    # Mean over the cases of 1/N: a uniform guess of one region of N (what argmax returns).
    chance_region: float
    # Mean over the cases of 1/2^N: a uniform guess over every binary fault vector (the
    # paper's "2^7 = 128 localisations" for CORTEX); the reference for exact-vector match.
    chance_vector: float
    # The cases whose faulty region(s) are the most frequent truth of their system (the same
    # region space) in the group: what always naming that answer, known in hindsight, scores.
    # The reference for an imbalanced set, such as a campaign of mostly hardware faults.
    majority: Ratio
    # Over every region of every case (micro-averaged): regions decided that were faulty /
    # regions decided, and / regions faulty. A run without a decision decided nothing.
    region_precision: Ratio
    region_recall: Ratio
    mean_prompt_tokens: float
    # Prompt tokens the server answered from its prefix cache, of all prompt tokens sent.
    cached_share: float | None
    mean_completion_tokens: float
    mean_seconds: float
    # Cases whose session view was cut to fit the context (never dropped: see the runner).
    cut_cases: int
    # Votes cast over the group, those that are abstentions, and the forced ones by cause.
    votes: int
    abstained: int
    forced_at_limit: int
    forced_by_context: int


@dataclass(frozen=True)
class PerAgent:
    """Each voter's own vote judged alone, beside the aggregate over the same cases."""

    agents: dict[str, Ratio]
    aggregate: Ratio


def truth_vector(result: CaseResult) -> Bits:
    return np.array([int(r in result.truth.regions) for r in result.region_ids], dtype=np.int64)


def exact_match(predicted: npt.ArrayLike, truth: npt.ArrayLike) -> bool:
    """Every bit equal. A truth naming no fault is never matched: every benchmark case has one,
    and POIROT-web records its all-zero trading run (no injected fault logged) as incorrect."""
    p, t = np.asarray(predicted, dtype=np.int64), np.asarray(truth, dtype=np.int64)
    return bool(t.any()) and p.shape == t.shape and bool(np.array_equal(p, t))


def attribution_hit(result: CaseResult) -> bool:
    return result.status == "ok" and exact_match(result.decision, truth_vector(result))


def step_hit(result: CaseResult, tolerance: int) -> bool:
    """The predicted step is within `tolerance` messages of the true one (integers, not text)."""
    truth, predicted = result.truth.step, result.step
    if result.status != "ok" or truth is None or predicted is None:
        return False
    return abs(predicted - truth) <= tolerance


def vote_hit(vote: Vote, truth: Bits) -> bool:
    """An agent's own vote names exactly the faulty region(s); an abstention is a miss."""
    return not vote.abstained and exact_match(vote.location, truth)


def confusion(predicted: npt.ArrayLike, truth: npt.ArrayLike) -> tuple[int, int, int, int]:
    """(TP, FP, FN, TN) over the regions: BLAME's partial-credit counts."""
    p = np.asarray(predicted, dtype=bool)
    t = np.asarray(truth, dtype=bool)
    if p.size == 0:
        p = np.zeros_like(t)
    return (
        int(np.sum(p & t)),
        int(np.sum(p & ~t)),
        int(np.sum(~p & t)),
        int(np.sum(~p & ~t)),
    )


def majority_answer(results: Sequence[CaseResult]) -> Ratio:
    """Per system (cases over the same regions), how many cases have its most frequent truth."""
    by_space: dict[tuple[str, ...], Counter[frozenset[str]]] = {}
    for r in results:
        by_space.setdefault(tuple(r.region_ids), Counter())[frozenset(r.truth.regions)] += 1
    hits = sum(max(truths.values()) for truths in by_space.values())
    return Ratio(hits=hits, total=len(results))


def summarise(results: Sequence[CaseResult]) -> Summary:
    single = [r for r in results if len(r.truth.regions) == 1]
    multi = [r for r in results if len(r.truth.regions) > 1]
    stepped = [r for r in results if r.truth.step is not None]
    sizes = np.array([len(r.region_ids) for r in results], dtype=np.float64)
    counts = [confusion(r.decision, truth_vector(r)) for r in results]
    tp, fp, fn = (sum(c[i] for c in counts) for i in range(3))
    prompt = sum(r.tokens.prompt for r in results)
    votes = [v for r in results for v in r.votes]
    return Summary(
        n=len(results),
        ok=sum(r.status == "ok" for r in results),
        context_exceeded=sum(r.status == "context_exceeded" for r in results),
        failed=sum(r.status in ("failed", "timeout") for r in results),
        attribution=_ratio(attribution_hit(r) for r in results),
        exact_single=_ratio(attribution_hit(r) for r in single),
        exact_multi=_ratio(attribution_hit(r) for r in multi),
        step={k: _ratio(step_hit(r, k) for r in stepped) for k in STEP_TOLERANCES},
        chance_region=_mean(1.0 / sizes),
        chance_vector=_mean(2.0**-sizes),
        majority=majority_answer(results),
        region_precision=Ratio(hits=tp, total=tp + fp),
        region_recall=Ratio(hits=tp, total=tp + fn),
        mean_prompt_tokens=_mean(np.array([r.tokens.prompt for r in results], dtype=np.float64)),
        cached_share=sum(r.tokens.cached for r in results) / prompt if prompt else None,
        mean_completion_tokens=_mean(
            np.array([r.tokens.completion for r in results], dtype=np.float64)
        ),
        mean_seconds=_mean(np.array([r.seconds for r in results], dtype=np.float64)),
        cut_cases=sum(r.context_cuts > 0 for r in results),
        votes=len(votes),
        abstained=sum(v.abstained for v in votes),
        forced_at_limit=sum(v.forced_by == "invocation_limit" for v in votes),
        forced_by_context=sum(v.forced_by == "context_full" for v in votes),
    )


def per_agent(results: Sequence[CaseResult]) -> PerAgent:
    """Accuracy of each voter over the finished cases it voted in, and of the aggregate there.

    Voters are keyed by agent id; the aggregate is over the finished cases with any vote.
    """
    hits: dict[str, list[bool]] = defaultdict(list)
    voted = [r for r in results if r.status == "ok" and r.votes]
    for result in voted:
        truth = truth_vector(result)
        for vote in result.votes:
            hits[vote.agent_id].append(vote_hit(vote, truth))
    return PerAgent(
        agents={agent: _ratio(h) for agent, h in sorted(hits.items())},
        aggregate=_ratio(attribution_hit(r) for r in voted),
    )


def groups(results: Iterable[CaseResult]) -> dict[tuple[str, str, str], list[CaseResult]]:
    """Results by (dataset, method, model), in sorted key order."""
    grouped: dict[tuple[str, str, str], list[CaseResult]] = defaultdict(list)
    for result in results:
        grouped[(result.dataset, result.method, result.model)].append(result)
    return dict(sorted(grouped.items()))


def agreement(
    results: Iterable[CaseResult],
) -> dict[tuple[str, str], dict[tuple[str, str], Ratio]]:
    """For each (dataset, model) run with several methods, each pair of methods: of the cases
    both finished, how many they decided alike (the same decision vector)."""
    decided: dict[tuple[str, str], dict[str, dict[str, tuple[int, ...]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in results:
        if r.status == "ok":
            decided[(r.dataset, r.model)][r.method][r.case_id] = tuple(r.decision)
    pairs: dict[tuple[str, str], dict[tuple[str, str], Ratio]] = {}
    for key, by_method in sorted(decided.items()):
        methods = sorted(by_method)
        table = {
            (a, b): _ratio(
                by_method[a][case] == by_method[b][case]
                for case in sorted(by_method[a].keys() & by_method[b].keys())
            )
            for i, a in enumerate(methods)
            for b in methods[i + 1 :]
        }
        if table:
            pairs[key] = table
    return pairs


def _ratio(hits: Iterable[bool]) -> Ratio:
    flags = list(hits)
    return Ratio(hits=sum(flags), total=len(flags))


def _mean(values: npt.NDArray[np.float64]) -> float:
    return float(values.mean()) if values.size else 0.0


# ------------------------------------------------------------------ campaigns

# A MAST mode as a vote names it ("MAST-3 Step repetition"): ErrorProbe's hypothesis.
_MODE = re.compile(r"^(MAST-\d+)\b")
# Confusion-matrix columns for a run that decided no region, or several.
NO_REGION = "(none)"
SEVERAL_REGIONS = "(several)"


@dataclass(frozen=True)
class ModeScores:
    """Failure-mode accuracy over the variants whose truth names a MAST mode, for a method that
    names one; F1 as AEGIS reports it (macro: the mean of the per-mode F1s over every mode in
    the truth or the predictions; micro: over all decisions pooled)."""

    accuracy: Ratio
    macro_f1: float
    micro_f1: float


@dataclass(frozen=True)
class CampaignScores:
    """One group of campaign results, split by what was injected."""

    by_kind: dict[str, Ratio]
    by_operator: dict[str, Ratio]
    # Truth region -> accuracy, and (precision, recall) of deciding that region.
    by_region: dict[str, Ratio]
    region_pr: dict[str, tuple[Ratio, Ratio]]
    # Truth region -> predicted region (or NO_REGION / SEVERAL_REGIONS) -> cases.
    confusion: dict[str, dict[str, int]]
    # None when the method names no failure mode or no variant has one.
    modes: ModeScores | None


def predicted_mode(result: CaseResult) -> str | None:
    """The MAST mode the run's highest-weighted mode-naming vote gives, if any."""
    named = [
        (v.weight, match.group(1))
        for v in result.votes
        if not v.abstained and (match := _MODE.match(v.hazard_vector))
    ]
    return max(named)[1] if named and result.status == "ok" else None


def predicted_label(result: CaseResult) -> str:
    """The region a run decided, as a confusion-matrix column."""
    regions = result.predicted_regions if result.status == "ok" else ()
    if not regions:
        return NO_REGION
    return regions[0] if len(regions) == 1 else SEVERAL_REGIONS


def campaign_scores(results: Sequence[CaseResult]) -> CampaignScores | None:
    """Scores by fault of the results that are campaign variants; None when there are none."""
    rows = [r for r in results if r.truth.fault is not None]
    if not rows:
        return None
    kinds: dict[str, list[bool]] = defaultdict(list)
    operators: dict[str, list[bool]] = defaultdict(list)
    regions: dict[str, list[bool]] = defaultdict(list)
    confusion: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # tp, fp, fn per region
    for r in rows:
        fault = r.truth.fault
        assert fault is not None
        hit = attribution_hit(r)
        kinds[fault.kind].append(hit)
        operators[fault.operator].append(hit)
        for region in r.truth.regions:
            regions[region].append(hit)
            confusion[region][predicted_label(r)] += 1
        decided = set(r.predicted_regions if r.status == "ok" else ())
        for region in set(r.region_ids):
            faulty = region in r.truth.regions
            if region in decided:
                counts[region][0 if faulty else 1] += 1
            elif faulty:
                counts[region][2] += 1
    return CampaignScores(
        by_kind={k: _ratio(v) for k, v in sorted(kinds.items())},
        by_operator={k: _ratio(v) for k, v in sorted(operators.items())},
        by_region={k: _ratio(v) for k, v in sorted(regions.items())},
        region_pr={
            region: (Ratio(tp, tp + fp), Ratio(tp, tp + fn))
            for region, (tp, fp, fn) in sorted(counts.items())
            if tp + fp + fn
        },
        confusion={t: dict(sorted(p.items())) for t, p in sorted(confusion.items())},
        modes=mode_scores(rows),
    )


def mode_scores(results: Sequence[CaseResult]) -> ModeScores | None:
    """Mode accuracy and F1 over the results whose truth names a mode; None when the method
    named no mode in any of the group's results (it does not diagnose modes)."""
    if not any(predicted_mode(r) for r in results):
        return None
    pairs = [
        (r.truth.fault.mode, predicted_mode(r))
        for r in results
        if r.truth.fault is not None and r.truth.fault.mode is not None
    ]
    if not pairs:
        return None
    correct = sum(t == p for t, p in pairs)
    predicted = sum(p is not None for _, p in pairs)
    micro_p = correct / predicted if predicted else 0.0
    micro_r = correct / len(pairs)
    labels = sorted({t for t, _ in pairs} | {p for _, p in pairs if p is not None})
    f1s = []
    for label in labels:
        tp = sum(t == label and p == label for t, p in pairs)
        fp = sum(t != label and p == label for t, p in pairs)
        fn = sum(t == label and p != label for t, p in pairs)
        f1s.append(_f1(tp, fp, fn))
    return ModeScores(
        accuracy=Ratio(correct, len(pairs)),
        macro_f1=float(np.mean(f1s)) if f1s else 0.0,
        micro_f1=_harmonic(micro_p, micro_r),
    )


def _f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def _harmonic(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0
