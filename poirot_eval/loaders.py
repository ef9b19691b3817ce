"""One entry point from a dataset name to its cases, with the filters the runner offers."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import get_args

from poirot_eval import blame, tracertraj, whowhen
from poirot_eval.cases import Dataset, EvalCase

DATASETS: tuple[Dataset, ...] = get_args(Dataset)


def load_cases(
    dataset: Dataset,
    data_dir: Path,
    *,
    ids: Collection[str] | None = None,
    limit: int | None = None,
) -> list[EvalCase]:
    """The dataset's cases in its own order; `ids` keeps those (all must exist), then `limit`.

    `data_dir` is the shared data folder (the one holding blame/, whowhen/, tracertraj/).
    """
    if dataset == "tracertraj":
        by_id = {c.case_id: c for c in tracertraj.load_all(data_dir)}
        return [by_id[i] for i in _chosen(list(by_id), ids, limit)]
    if dataset == "whowhen":
        known = whowhen.case_ids(data_dir)
        return [whowhen.load(data_dir, i) for i in _chosen(known, ids, limit)]
    known = blame.case_ids(data_dir, dataset)
    return [blame.load(data_dir, dataset, i) for i in _chosen(known, ids, limit)]


def _chosen(known: list[str], ids: Collection[str] | None, limit: int | None) -> list[str]:
    unknown = sorted(set(ids or ()) - set(known))
    if unknown:
        raise KeyError(f"unknown case ids: {unknown}")
    chosen = [k for k in known if ids is None or k in ids]
    return chosen if limit is None else chosen[:limit]
