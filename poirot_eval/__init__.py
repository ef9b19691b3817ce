"""Evaluation on public attribution benchmarks: load cases, run them through the daemon, score.

Installed with the `eval` extra (`pip install 'poirotd[eval]'`), which adds what only the
harness needs: pyarrow (TracerTraj's parquet file) and matplotlib (the report's figures). The
daemon never imports this package; `poirotd eval` and `poirotd replay` load it when run.
"""

from importlib.util import find_spec

# The extra's libraries are imported where they are used, some only halfway through a run: a
# core install (`pip install poirotd`) fails here instead, at once, naming what is missing.
EXTRA_MODULES = ("matplotlib", "pyarrow")
_missing = [name for name in EXTRA_MODULES if find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"poirot_eval needs {' and '.join(_missing)}: pip install 'poirotd[eval]'",
        name=_missing[0],
    )
