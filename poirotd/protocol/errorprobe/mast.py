"""The MAST taxonomy of multi-agent failures (Cemri et al., 2025): 14 failure modes in three
categories (specification, coordination, verification), as ErrorProbe tags sessions with them.

The modes ship with the daemon (`mast_taxonomy.json`, from AdaMAST, Apache-2.0) and are read
once; a mode is named by its id ("MAST-3") everywhere: tags, hypotheses, memory signatures.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from poirotd.model import Frozen


class MastMode(Frozen):
    id: str
    name: str
    description: str
    category: str


@cache
def mast_modes() -> tuple[MastMode, ...]:
    """The 14 modes, in taxonomy order."""
    text = resources.files(__package__).joinpath("mast_taxonomy.json").read_text("utf-8")
    return tuple(MastMode.model_validate(code) for code in json.loads(text)["codes"])


def mode_ids() -> list[str]:
    return [m.id for m in mast_modes()]


def mode_named(mode_id: str) -> MastMode:
    for mode in mast_modes():
        if mode.id == mode_id:
            return mode
    raise KeyError(mode_id)


def taxonomy_text() -> str:
    """The modes as a prompt lists them."""
    return "\n".join(f"- {m.id} {m.name} ({m.category}): {m.description}" for m in mast_modes())
