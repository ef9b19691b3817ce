"""BENCHMARKS.md is shared by several benches: each rewrites only its own marked section. Here
are the markers, the writing of one section, what every section's text shares (the run's stamp,
the command that reruns it, prose re-wrapped), and the command line the benches share (`main`).

A bench measures in bench/NAME.py into a plain results object and renders it as Markdown in
bench/sections/NAME.py (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import tempfile
import textwrap
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from poirot_eval.provenance import source_commit

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "BENCHMARKS.md"
Plan = TypeVar("Plan")
Results = TypeVar("Results")
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


def stamp() -> str:
    """The opening of a section's first sentence: when, on which commit, on which Python."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return f"Run {when} on commit {commit_text()}, {python}"


def command(module: str, mode: str) -> str:
    """The command that runs `module` (bench.NAME) again in `mode` (full is the default)."""
    return f"python -m {module}" + ("" if mode == "full" else f" --{mode}")


def listed(values: Sequence[float]) -> str:
    """Per-round figures (ratios) as a section lists them."""
    return ", ".join(f"{v:.2f}" for v in values)


def reflow(text: str, width: int = 100) -> str:
    """Re-wraps the prose paragraphs and bullets (figures made their lines ragged); tables,
    headings and markers stay as they are (a marker right under a paragraph is set apart from
    it first, or the paragraph would swallow it)."""
    text = re.sub(r"(?<=[^\n])\n(<!-- [^\n]* -->)$", r"\n\n\1", text, flags=re.M)
    blocks = []
    for block in text.split("\n\n"):
        if block.startswith(("|", "#", "<!--")):
            blocks.append(block)
            continue
        items = re.split(r"\n(?=- )", block)
        blocks.append(
            "\n".join(
                textwrap.fill(
                    " ".join(item.split()),
                    width,
                    subsequent_indent="  " if item.startswith("- ") else "",
                    break_on_hyphens=False,
                )
                for item in items
            )
        )
    return "\n\n".join(blocks)


def add_no_write(parser: argparse.ArgumentParser) -> None:
    """The option of every bench that writes a section: print it, leave BENCHMARKS.md."""
    parser.add_argument("--no-write", action="store_true", help="print, leave BENCHMARKS.md")


def publish(name: str, text: str, *, write: bool) -> None:
    """Prints the section `name` re-wrapped and, with `write`, puts it into BENCHMARKS.md."""
    text = reflow(text)
    if write:
        write_section(name, text)
    print(text)


def main(
    module: str,
    doc: str | None,
    quick: str,
    plan: Callable[[str], Plan],
    run: Callable[[Plan, Path], Coroutine[Any, Any, Results]],
    section: Callable[[Plan, Results], str],
) -> None:
    """The command line of a bench with a full and a `--quick` mode: `plan(mode)` sizes the
    run, `run` measures in a temporary folder, `section` renders the results, and the section
    `MODULE MODE` of BENCHMARKS.md takes them (`--no-write`: print only)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    add_no_write(parser)
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    p = plan(mode)
    with tempfile.TemporaryDirectory(prefix=f"{module.replace('.', '-')}-") as tmp:
        results = asyncio.run(run(p, Path(tmp)))
    publish(f"{module} {mode}", section(p, results), write=not args.no_write)
