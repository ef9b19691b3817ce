"""The benchmark data the tests read: a few cases of each published set, kept in the repository
(tests/data/eval, laid out as the folder `poirotd eval --data-dir` names; its README says where
each file came from), so that a clone passes its tests with nothing beside it. The full sets are
the user's to fetch; the checks that read every case of a set also run over them when
POIROTD_EVAL_DATA (the eval CLI's variable) names their folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poirot_eval.cases import Dataset
from poirot_eval.loaders import source

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"
RUNS = DATA / "poirot-runs"


def full_data(dataset: Dataset) -> Path:
    """The folder of the full published sets holding `dataset`; skips the test, saying why, when
    POIROTD_EVAL_DATA does not name one."""
    named = os.environ.get("POIROTD_EVAL_DATA")
    if not named:
        pytest.skip("POIROTD_EVAL_DATA unset: no full published sets to read")
    where = source(dataset, Path(named))
    if not where.exists():
        pytest.skip(f"POIROTD_EVAL_DATA names a folder without {dataset}: no {where}")
    return Path(named)
