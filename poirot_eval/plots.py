"""The report's figures: per-agent radar (the paper's Fig. 4) and vote projection (Fig. 5).

Figures are drawn on `matplotlib.figure.Figure` objects and saved as PNG with the Agg renderer,
never through pyplot, so no display or global figure state is involved.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle

from poirot_eval.results import CaseResult
from poirot_eval.scoring import PerAgent, truth_vector
from poirotd.protocol.projection import RADIUS, anchors, project

# More axes than this make a radar unreadable; the most frequent voters are kept.
MAX_RADAR_AXES = 16
# Small multiples beyond this are too small to read.
MAX_CASE_PANELS = 12
_DPI = 120
_VOTER_MARKERS = ("o", "s", "^", "v", "P", "X", "<", ">", "p", "h", "8", "d")
_VOTE_OFFSET = 0.03


def voter_label(agent_id: str) -> str:
    """The baseline's single evaluator votes under the empty agent id."""
    return agent_id or "single LLM (baseline)"


def radar(stats: PerAgent, title: str, path: Path) -> Path:
    """Each axis a voter, at the accuracy of its own votes; the shaded disc is the aggregate's."""
    ranked = sorted(stats.agents.items(), key=lambda kv: (-kv[1].total, kv[0]))[:MAX_RADAR_AXES]
    labels = [voter_label(agent) for agent, _ in ranked]
    values = [ratio.value or 0.0 for _, ratio in ranked]
    angles = np.linspace(0.0, 2.0 * np.pi, len(labels), endpoint=False)
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot(projection="polar")
    aggregate = stats.aggregate.value or 0.0
    circle = np.linspace(0.0, 2.0 * np.pi, 200)
    ax.fill(circle, np.full_like(circle, aggregate), alpha=0.25, color="tab:orange")
    ax.plot(circle, np.full_like(circle, aggregate), color="tab:orange", label="aggregate")
    closed = np.append(angles, angles[:1])
    ax.plot(closed, [*values, *values[:1]], marker="o", color="tab:blue", label="agent alone")
    ax.set_xticks(angles, labels, fontsize=8)
    ax.set_ylim(0.0, 1.0)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", bbox_to_anchor=(1.15, -0.1), fontsize=8)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def radial(results: Sequence[CaseResult], title: str, path: Path) -> Path:
    """Ground truths (stars), consensus decisions (diamonds, larger when runs agree) and single
    votes (one small marker per voter, darker where runs repeat a vote), coloured by ground
    truth, on eq. 12's plane. All results must share one hazard space."""
    if any(r.region_ids != results[0].region_ids for r in results):
        raise ValueError("a radial projection needs one hazard space for all results")
    fig = Figure(figsize=(7, 7))
    ax = fig.add_subplot()
    _project_onto(ax, results, label_size=7)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def radial_per_case(results: Sequence[CaseResult], title: str, path: Path) -> Path:
    """One small projection per case (at most MAX_CASE_PANELS), for sets such as Who&When
    where every case has its own hazard space and one shared plane would mean nothing."""
    shown = list(results)[:MAX_CASE_PANELS]
    columns = min(4, len(shown))
    rows = -(-len(shown) // columns)
    fig = Figure(figsize=(3.2 * columns, 3.4 * rows))
    for i, result in enumerate(shown, start=1):
        ax = fig.add_subplot(rows, columns, i)
        _project_onto(ax, [result], label_size=5)
        ax.set_title(f"case {result.case_id}", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def _project_onto(ax: Axes, results: Sequence[CaseResult], *, label_size: int) -> None:
    region_ids = results[0].region_ids
    ax.add_patch(Circle((0.0, 0.0), RADIUS, fill=False, color="0.7", linestyle="--"))
    for (x, y), label in zip(anchors(len(region_ids)), region_ids, strict=True):
        ax.annotate(label, (x * 1.12, y * 1.12), ha="center", va="center", fontsize=label_size)
    scenarios = sorted({tuple(int(b) for b in truth_vector(r)) for r in results})
    colours = {s: f"C{i % 10}" for i, s in enumerate(scenarios)}
    # Each voter keeps one marker and a small fixed offset, so coinciding votes stay visible.
    voters = sorted({v.agent_id for r in results for v in r.votes})
    markers = {a: _VOTER_MARKERS[i % len(_VOTER_MARKERS)] for i, a in enumerate(voters)}
    ring = anchors(max(len(voters), 1), _VOTE_OFFSET)
    offsets = {a: ring[i] for i, a in enumerate(voters)}
    for scenario in scenarios:
        mine = [r for r in results if tuple(int(b) for b in truth_vector(r)) == scenario]
        colour = colours[scenario]
        votes = Counter((v.agent_id, v.location) for r in mine for v in r.votes if not v.abstained)
        decisions = Counter(r.decision for r in mine if r.status == "ok" and r.decision)
        for (voter, location), count in votes.items():
            (x, y) = project([location])[0] + offsets[voter]
            ax.scatter(
                x,
                y,
                s=22,
                color=colour,
                alpha=min(1.0, 0.3 * count),
                marker=markers[voter],
                zorder=3,
            )
        for decision, count in decisions.items():
            (x, y) = project([decision])[0]
            ax.scatter(x, y, s=60 * count, color=colour, marker="D", edgecolors="black")
        (x, y) = project([scenario])[0]
        name = "+".join(r for r, bit in zip(region_ids, scenario, strict=True) if bit) or "none"
        ax.scatter(x, y, s=220, color=colour, marker="*", edgecolors="black", label=f"GT {name}")
    ax.set_xlim(-0.75, 0.75)
    ax.set_ylim(-0.75, 0.75)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])


def confusion(matrix: dict[str, dict[str, int]], title: str, path: Path) -> Path:
    """Rows the true faulty region, columns what the method decided (a region, none, several);
    each cell the share of that row's variants, with its count."""
    rows = list(matrix)
    columns = sorted({c for row in matrix.values() for c in row})
    counts = np.array([[matrix[r].get(c, 0) for c in columns] for r in rows], dtype=np.float64)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    fig = Figure(figsize=(1.0 + 0.8 * len(columns), 1.2 + 0.5 * len(rows)))
    ax = fig.add_subplot()
    ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("decided", fontsize=8)
    ax.set_ylabel("faulty (truth)", fontsize=8)
    for i in range(len(rows)):
        for j in range(len(columns)):
            if counts[i, j]:
                colour = "white" if shares[i, j] > 0.5 else "black"
                ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", fontsize=7,
                        color=colour)  # fmt: skip
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def accuracy_by(
    table: dict[str, dict[str, float | None]], title: str, ylabel: str, path: Path
) -> Path:
    """Grouped bars: one group per key (a fault kind), one bar per series (a method)."""
    series = list(table)
    keys = sorted({k for values in table.values() for k in values})
    width = 0.8 / max(len(series), 1)
    fig = Figure(figsize=(1.5 + 1.2 * len(keys), 4))
    ax = fig.add_subplot()
    x = np.arange(len(keys), dtype=np.float64)
    for i, name in enumerate(series):
        rates = [table[name].get(k) for k in keys]
        bars = ax.bar(x + i * width - 0.4 + width / 2, [r or 0.0 for r in rates], width, label=name)
        # Each bar says its rate, so a zero is told apart from a series with no case there (—).
        labels = ["—" if r is None else f"{100 * r:.0f}" for r in rates]
        ax.bar_label(bars, labels=labels, fontsize=6, padding=1)
    ax.set_xticks(x, keys, fontsize=8)
    ax.set_ylim(0.0, 1.08)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    # Below the axes: inside, it hid the tallest bars.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path
