"""Where the shared data folder (recorded POIROT runs, the benchmarks' cases) is."""

from __future__ import annotations

import os
from pathlib import Path

# Beside the checkout, as it is for CI; POIROTD_EVAL_DATA (the eval CLI's variable) overrides it
# for a checkout elsewhere, e.g. a git worktree.
DATA = Path(
    os.environ.get("POIROTD_EVAL_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data"
)
RUNS = DATA / "poirot-runs"
