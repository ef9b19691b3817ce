"""BENCHMARKS.md is shared by several benches: each rewrites only its own marked section."""

from __future__ import annotations

from pathlib import Path

from poirot_eval.provenance import source_commit

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "BENCHMARKS.md"
HEADER = """# Benchmarks

Figures are ratios of rates measured side by side in one run, on a shared 2-core machine whose
other tenants load it unpredictably: absolute numbers move from run to run, the ratios much less.
Each section says when it was run, on which commit, and how to run it again.
"""


def begin_marker(name: str) -> str:
    return f"<!-- {name}: begin (generated; edits are overwritten) -->"


def end_marker(name: str) -> str:
    return f"<!-- {name}: end -->"


def replace_section(current: str, name: str, text: str) -> str:
    """`current` with section `name` replaced by `text` (which carries both markers), or with
    `text` appended when the section is not there yet; everything else stays byte for byte."""
    begin, end = begin_marker(name), end_marker(name)
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        return head + text + rest.split(end, 1)[1]
    return current.rstrip("\n") + "\n\n" + text + "\n"


def write_section(name: str, text: str, report: Path = REPORT) -> None:
    current = report.read_text() if report.exists() else HEADER
    report.write_text(replace_section(current, name, text))


def commit_text() -> str:
    """The measured commit as a section names it: `abc1234`, and whether the tree had changes."""
    commit = source_commit()
    if commit is None:
        return "`unknown`"
    head = commit.removesuffix("-dirty")
    return f"`{head[:7]}`" + (" plus uncommitted changes" if head != commit else "")
