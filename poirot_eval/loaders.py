"""One entry point from a dataset name to its cases, with the filters the runner offers."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import get_args

from poirot_eval import blame, tracertraj, whowhen
from poirot_eval.cases import Benchmark, Dataset, EvalCase

# The datasets a data folder holds (campaign variants are files named with --cases).
DATASETS: tuple[Benchmark, ...] = get_args(Benchmark)


def load_cases(
    dataset: Dataset,
    data_dir: Path,
    *,
    ids: Collection[str] | None = None,
    limit: int | None = None,
) -> list[EvalCase]:
    """The dataset's cases in its own order; `ids` keeps those (all must exist), then `limit`.

    `data_dir` is the data folder the user names (the one holding blame/, whowhen/,
    tracertraj/); the datasets are not in the repository, so a missing one says where to look.
    """
    if dataset == "campaign":
        raise ValueError(
            "campaign variants are files, not a dataset of the data folder: name the folder "
            "`poirotd campaign` wrote with --cases"
        )
    where = source(dataset, data_dir)
    if not where.exists():
        raise FileNotFoundError(
            f"no {where}: the data folder (--data-dir, POIROTD_EVAL_DATA) lacks {dataset}; "
            'docs/evaluation.md, "Evaluation on public benchmarks", says where to get it'
        )
    if dataset == "tracertraj":
        by_id = {c.case_id: c for c in tracertraj.load_all(data_dir)}
        return [by_id[i] for i in _chosen(list(by_id), ids, limit, where)]
    if dataset in whowhen.FOLDERS:
        known = whowhen.case_ids(data_dir, dataset)
        return [whowhen.load(data_dir, dataset, i) for i in _chosen(known, ids, limit, where)]
    known = blame.case_ids(data_dir, dataset)
    return [blame.load(data_dir, dataset, i) for i in _chosen(known, ids, limit, where)]


def source(dataset: Dataset, data_dir: Path) -> Path:
    """The folder (or file) a dataset's cases are read from, for messages."""
    if dataset == "tracertraj":
        return data_dir / tracertraj.FILE
    if dataset in whowhen.FOLDERS:
        return data_dir / whowhen.FOLDERS[dataset]
    return data_dir / blame.FOLDER / blame.benchmark(dataset).folder / "cases"


def _chosen(
    known: list[str], ids: Collection[str] | None, limit: int | None, where: Path
) -> list[str]:
    unknown = sorted(set(ids or ()) - set(known))
    if unknown:
        listed = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
        raise KeyError(f"no case {unknown} in {where} (cases there: {listed or 'none'})")
    chosen = [k for k in known if ids is None or k in ids]
    return chosen if limit is None else chosen[:limit]
