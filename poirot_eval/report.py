"""The evaluation report: one markdown file with the score tables, and the figures beside it."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from poirot_eval import plots
from poirot_eval.results import CaseResult
from poirot_eval.scoring import (
    STEP_TOLERANCES,
    CampaignScores,
    Ratio,
    Summary,
    agreement,
    campaign_scores,
    groups,
    per_agent,
    summarise,
)

REPORT = "report.md"

_ACCURACY = (
    "dataset",
    "method",
    "model",
    "n",
    "ok",
    "context_exceeded",
    "failed",
    "agent acc",
    *(f"step ±{k}" if k else "step exact" for k in STEP_TOLERANCES),
    "exact k=1",
    "exact k>1",
    "region precision",
    "region recall",
    "chance 1/N",
    "chance 1/2^N",
    "majority",
)
_COST = (
    "dataset",
    "method",
    "model",
    "n",
    "mean prompt tokens",
    "cached share",
    "mean completion tokens",
    "mean seconds",
    "cases cut to fit",
    "votes",
    "abstained",
    "forced: M replies",
    "forced: context full",
)

_NOTES = """\
Rates are over all n cases of a row: a failed or context-exceeded run counts as a miss.
*agent acc*: the decision names exactly the faulty region(s), matched by id (for BLAME, the
overall exact-vector accuracy). *step*: the predicted session index is within ±k messages of the
true one. *exact k=1 / k>1*: exact-vector match over the cases with one / several faults.
*region precision / recall*: over every region of every case, the regions decided that were
faulty, of those decided / of those faulty.
*chance 1/N*: mean over cases of 1/N for N regions (a uniform single-region guess);
*chance 1/2^N*: mean of 1/2^N (a uniform guess over all fault vectors, the reference for exact
vectors). *majority*: the cases whose faulty region(s) are their system's most frequent truth
in the row, i.e. what always naming that one answer would score (known in hindsight): the
reference for a set where one answer dominates, as a campaign of mostly hardware faults does.
A dash: no case to score.
"""

_COST_NOTES = """\
*cached share*: prompt tokens the server answered from its prefix cache, of all sent.
*cases cut to fit*: cases where the context budget shortened or dropped session messages
(recorded per case). *forced*: votes asked for after an agent used its M replies, or when its
consultation filled the context window.
"""


_AGREEMENT_NOTES = """\
Over the cases both methods finished: the share where their decision vectors are equal.
"""


def render_report(results: Sequence[CaseResult], out_dir: Path) -> Path:
    """Write report.md and its PNG figures into `out_dir`; returns the markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    grouped = groups(results)
    summaries = {key: summarise(rows) for key, rows in grouped.items()}
    lines = ["# Attribution evaluation", "", _NOTES, *_table(_ACCURACY)]
    lines += [_row((*key, *_accuracy(s))) for key, s in summaries.items()]
    lines += ["", "## Cost and reliability", "", _COST_NOTES, *_table(_COST)]
    lines += [_row((*key, *_cost(s))) for key, s in summaries.items()]
    lines += _combined(grouped)
    lines += _agreement(results)
    lines += _campaign(grouped, out_dir)
    for key, rows in grouped.items():
        lines += _figures(key, rows, out_dir)
    path = out_dir / REPORT
    path.write_text("\n".join(lines) + "\n")
    return path


def percent(ratio: Ratio) -> str:
    """How a rate is written in the report: "66.7% (2/3)", or a dash when nothing was scored."""
    value = ratio.value
    return "—" if value is None else f"{100 * value:.1f}% ({ratio.hits}/{ratio.total})"


def _accuracy(s: Summary) -> tuple[str, ...]:
    return (
        str(s.n),
        str(s.ok),
        str(s.context_exceeded),
        str(s.failed),
        percent(s.attribution),
        *(percent(s.step[k]) for k in STEP_TOLERANCES),
        percent(s.exact_single),
        percent(s.exact_multi),
        percent(s.region_precision),
        percent(s.region_recall),
        f"{100 * s.chance_region:.2f}%",
        f"{100 * s.chance_vector:.3g}%",
        percent(s.majority),
    )


def _cost(s: Summary) -> tuple[str, ...]:
    return (
        str(s.n),
        f"{s.mean_prompt_tokens:.0f}",
        "—" if s.cached_share is None else f"{100 * s.cached_share:.1f}%",
        f"{s.mean_completion_tokens:.0f}",
        f"{s.mean_seconds:.1f}",
        str(s.cut_cases),
        str(s.votes),
        str(s.abstained),
        str(s.forced_at_limit),
        str(s.forced_by_context),
    )


def _combined(grouped: dict[tuple[str, str, str], list[CaseResult]]) -> list[str]:
    """Says which ensemble rows were combined from recorded member lines (ensemble_lines.py)."""
    notes = []
    for (dataset, method, model), rows in grouped.items():
        combined = [r for r in rows if r.ensemble_of]
        if combined:
            members = ", ".join(combined[0].ensemble_of)
            notes.append(
                f"{dataset} / {method} / {model}: {len(combined)} of {len(rows)} lines were "
                f"combined from the lines of its members ({members}) recorded for the same case, "
                "not run again; their tokens and seconds are the sums of those members' runs."
            )
    return ["", *notes] if notes else []


def _agreement(results: Sequence[CaseResult]) -> list[str]:
    """Pairs of methods run on the same cases: how often they decided alike."""
    pairs = agreement(results)
    if not pairs:
        return []
    lines = ["", "## Agreement between methods", "", _AGREEMENT_NOTES]
    lines += _table(("methods", "dataset", "model", "same decision"))
    for (dataset, model), table in pairs.items():
        lines += [
            _row((f"{a} / {b}", dataset, model, percent(ratio))) for (a, b), ratio in table.items()
        ]
    return lines


_CAMPAIGN_NOTES = """\
Campaign variants (`poirotd campaign`), split by what was injected. *by fault kind / operator /
faulty region*: the decision names exactly the injected region, over the variants of that kind.
*precision / recall* of a region: of the variants where the method decided it, how many had it
faulty / of those that had it faulty, how many decided it. *mode*: for a method that names a
MAST failure mode (ErrorProbe), over the variants whose fault enacts one: accuracy, and F1
macro-averaged over the modes and micro-averaged over the variants, as AEGIS reports them.
Step accuracy (exact, ±k) is in the first table (agent faults carry a step; hardware and feed
faults do not). The confusion matrices are per method: rows the faulty region, columns the
region decided ((none): no decision, (several): more than one region).
"""


def _campaign(grouped: dict[tuple[str, str, str], list[CaseResult]], out_dir: Path) -> list[str]:
    """The campaign section: accuracy by fault kind, operator and region, mode scores, plots."""
    scored = {key: s for key, rows in grouped.items() if (s := campaign_scores(rows)) is not None}
    if not scored:
        return []
    lines = ["", "## Campaign: accuracy by fault", "", _CAMPAIGN_NOTES]
    lines += _by(scored, "fault kind", lambda s: s.by_kind)
    lines += _by(scored, "operator", lambda s: s.by_operator)
    lines += _by(scored, "faulty region", lambda s: s.by_region)
    lines += ["", *_table(("method", "model", "region", "precision", "recall"))]
    for (_, method, model), s in scored.items():
        lines += [
            _row((method, model, region, percent(precision), percent(recall)))
            for region, (precision, recall) in s.region_pr.items()
        ]
    moded = {key: s.modes for key, s in scored.items() if s.modes is not None}
    if moded:
        lines += ["", *_table(("method", "model", "mode accuracy", "macro F1", "micro F1"))]
        lines += [
            _row((m, model, percent(x.accuracy), f"{x.macro_f1:.3f}", f"{x.micro_f1:.3f}"))
            for (_, m, model), x in moded.items()
        ]
    by_kind = {
        f"{method} / {model}" if model else method: {k: r.value for k, r in s.by_kind.items()}
        for (_, method, model), s in scored.items()
    }
    bars = plots.accuracy_by(
        by_kind, "Accuracy by fault kind", "accuracy", out_dir / "campaign-by-kind.png"
    )
    lines += ["", f"![accuracy by fault kind]({bars.name})"]
    for (_, method, model), s in scored.items():
        slug = re.sub(r"[^a-z0-9]+", "-", f"{method}-{model}".lower()).strip("-")
        title = (
            f"{method} / {model}: faulty vs decided" if model else f"{method}: faulty vs decided"
        )
        figure = plots.confusion(s.confusion, title, out_dir / f"confusion-{slug}.png")
        lines += ["", f"![confusion matrix, {method}]({figure.name})"]
    return lines


def _by(
    scored: dict[tuple[str, str, str], CampaignScores],
    what: str,
    pick: Callable[[CampaignScores], dict[str, Ratio]],
) -> list[str]:
    """A table: one row per method, one column per value of `what`."""
    columns = sorted({k for s in scored.values() for k in pick(s)})
    lines = ["", f"Accuracy by {what}:", "", *_table(("method", "model", *columns))]
    for (_, method, model), s in scored.items():
        values = pick(s)
        lines.append(_row((method, model, *(percent(values.get(c, Ratio(0, 0))) for c in columns))))
    return lines


def _figures(key: tuple[str, str, str], rows: Sequence[CaseResult], out_dir: Path) -> list[str]:
    """Per-agent table and radar when there are votes; the projection when the space is shared."""
    title = " / ".join(k for k in key if k)
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    stats = per_agent(rows)
    if not stats.agents:
        return []
    lines = ["", f"## {title}", "", "| voter | accuracy of its own vote |", "| --- | --- |"]
    lines += [
        f"| {plots.voter_label(agent)} | {percent(ratio)} |"
        for agent, ratio in stats.agents.items()
    ]
    lines.append(f"| **aggregate** | {percent(stats.aggregate)} |")
    radar = plots.radar(stats, f"{title}: voters alone vs aggregate", out_dir / f"radar-{slug}.png")
    lines += ["", f"![per-agent accuracy]({radar.name})"]
    shared_space = len({r.region_ids for r in rows}) == 1
    draw = plots.radial if shared_space else plots.radial_per_case
    radial = draw(rows, f"{title}: votes, consensus, truth", out_dir / f"radial-{slug}.png")
    lines += ["", f"![radial projection]({radial.name})"]
    return lines


def _table(columns: Sequence[str]) -> list[str]:
    return [_row(columns), _row(("---",) * len(columns))]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
