"""Which cases a command works on: a dataset slice for `eval run`, one case for replay and spec."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from poirot_eval.cases import Dataset, EvalCase
from poirot_eval.loaders import DATASETS, load_cases


def select_cases(
    dataset: Dataset,
    data_dir: Path,
    *,
    ids: Collection[str] | None,
    offset: int,
    limit: int | None,
) -> list[EvalCase]:
    """The dataset's cases in its own order, kept by `ids`, then `limit` of them from `offset`
    (offset and limit make splits: --offset 0 --limit 60, then --offset 60)."""
    stop = None if limit is None else offset + limit
    return load_cases(dataset, data_dir, ids=ids, limit=stop)[offset:]


def resolve_case(ref: str, data_dir: Path) -> EvalCase:
    """`dataset:case_id` (e.g. whowhen:12), or the path of a JSON file holding one EvalCase.
    Raises ValueError saying which form was expected."""
    name, _, case_id = ref.partition(":")
    dataset = next((d for d in DATASETS if d == name and case_id), None)
    if dataset is not None:
        try:
            [case] = load_cases(dataset, data_dir, ids=[case_id])
        except KeyError as exc:
            raise ValueError(f"{ref}: {exc.args[0]}") from exc
        return case
    path = Path(ref)
    if not path.is_file():
        raise ValueError(
            f"{ref}: neither DATASET:CASE_ID (datasets: {', '.join(DATASETS)}) nor a case file"
        )
    return EvalCase.model_validate_json(path.read_bytes())
