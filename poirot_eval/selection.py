"""Which cases a command works on: a dataset slice for `eval run`, one case for replay and spec."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from poirot_eval.case_files import CaseFileError, read_record
from poirot_eval.cases import CASE_SHAPE, Dataset, EvalCase
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
    return read_case_file(path)


def read_case_file(path: Path) -> EvalCase:
    """A one-case JSON file; raises CaseFileError naming what is wrong, and the command that
    turns it into a case when it is a run recorded by the POIROT web tool."""
    try:
        return read_record(path, EvalCase, CASE_SHAPE)
    except CaseFileError as exc:
        if _is_web_tool_run(path):
            raise CaseFileError(
                f"{path}: a run recorded by the POIROT web tool, not a case: "
                f"`poirotd eval import-run {path} --case-out case.json` writes its case"
            ) from exc
        raise


def _is_web_tool_run(path: Path) -> bool:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "voting_data" in record


def read_case_folder(
    folder: Path, *, ids: Collection[str] | None, offset: int, limit: int | None
) -> list[EvalCase]:
    """Every one-case JSON file of `folder` (a campaign's variants), by case id, kept by `ids`,
    then `limit` of them from `offset`. Raises CaseFileError for a file that is not a case."""
    if not folder.is_dir():
        raise CaseFileError(f"{folder}: no such folder")
    cases = sorted((read_case_file(p) for p in folder.glob("*.json")), key=lambda c: c.case_id)
    unknown = sorted(set(ids or ()) - {c.case_id for c in cases})
    if unknown:
        raise KeyError(f"no case {unknown} in {folder}")
    chosen = [c for c in cases if ids is None or c.case_id in ids]
    stop = None if limit is None else offset + limit
    return chosen[offset:stop]
