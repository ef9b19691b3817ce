"""The commit a run directory or a benchmark section names: poirotd's own checkout, or none."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import report
from poirot_eval import provenance

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not run from a git checkout")
def test_the_commit_is_the_checkouts_head_marked_when_the_tree_has_changes() -> None:
    head = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain"))
    assert provenance.source_commit() == head + ("-dirty" if dirty else "")
    changes = " plus uncommitted changes" if dirty else ""
    assert report.commit_text() == f"`{head[:7]}`{changes}"


def test_no_commit_outside_a_checkout_or_inside_another_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provenance, "_ROOT", tmp_path)
    assert provenance.source_commit() is None  # no repository at all
    _git("init", "-q", cwd=tmp_path)
    package = tmp_path / "site-packages"
    package.mkdir()
    monkeypatch.setattr(provenance, "_ROOT", package)
    assert provenance.source_commit() is None  # an installed copy inside someone's repository
    assert report.commit_text() == "`unknown`"
