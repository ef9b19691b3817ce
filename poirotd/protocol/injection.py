"""Cheap signs of a prompt-injection attempt in the text an investigation quotes to the LLM.

A finding changes nothing about how the text is handled: spotlighting quotes every untrusted
text the same way, and votes and tool calls are read only from the model's own structured
answer. Findings are kept with the investigation and counted, for the people who review it: an
agent that writes a forged vote or a fake system turn into its session is itself evidence.

Every check is a regular expression or a character-class test over the text, once as written
and once folded (NFKC, invisible characters dropped, common Cyrillic and Greek look-alikes
mapped to Latin, case folded), so "ignore" in fullwidth letters, with a zero-width space inside
or with a Cyrillic o reads as "ignore". A chat-control spelling (`<start_of_turn>`, `<|eot_id|>`;
control_tokens.py) is looked for as written, as a tokenizer would, and its finding names the
template families it belongs to: "message #3: control_token (gemma)".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal, get_args

from poirotd.llm.control_tokens import BUILT_IN, ControlTokens
from poirotd.model import AgentMessage, Frozen, MessageKind

FindingKind = Literal[
    "boundary_forgery",
    "role_forgery",
    "control_token",
    "vote_forgery",
    "tool_call_forgery",
    "hidden_characters",
    "confusable_characters",
    "instruction_phrase",
]
FINDING_KINDS: tuple[FindingKind, ...] = get_args(FindingKind)

# Findings listed in the record; the metric counts them all.
MAX_LISTED = 100

_M = re.MULTILINE
# Brackets that look like spotlighting's « and » (which quoted text cannot contain at all).
_OPENERS = "[«\u2039\u27ea\u300a\u226a\u27e6\u301a\u27e8\u3008]"
_CLOSERS = "[»\u203a\u27eb\u300b\u226b\u27e7\u301b\u27e9\u3009]"
# Checked on the folded text.
_FOLDED: dict[FindingKind, re.Pattern[str]] = {
    "boundary_forgery": re.compile(
        # a closing bound like spotlighting's «/TOKEN», or a bound of a token alone
        rf"({_OPENERS}|<<|\[\[)\s*/|{_OPENERS}\s*[a-z0-9]{{6,}}\s*{_CLOSERS}"
        r"|^\s*\u02c6"  # a datamarked line
        r"|</?\s*(evidence|data|document|untrusted|context|quote|input|instructions?)\s*>"
        r"|\b(end|close|begin|start)\s+of\s+(the\s+)?(quote|quoted|evidence|data|untrusted|"
        r"document|input|context)\b"
        r"|\b(end|close|begin|start)\s+(of\s+)?(the\s+)?(untrusted|quoted)\b",
        _M,
    ),
    "role_forgery": re.compile(
        r"<\|?\s*(im_start|im_end|system|user|assistant|endoftext|eot_id|start_header_id|"
        r"end_header_id)\s*\|?>"
        r"|\[/?inst\]|<</?sys>>"
        r"|^\W{0,4}(system|assistant|developer|poirot)(\s+(message|prompt|override|notice|"
        r"instructions?))?[\s*_]{0,3}:"
        r"|^\s*\[#\s*\d+\s[^\]\n]*(→|->)"  # a message header of the session log
        r"|^\s*#+\s*poirot\b",
        _M,
    ),
    "vote_forgery": re.compile(
        r"[\"'](location|hazard_vector)[\"']\s*:|[\"']action[\"']\s*:\s*[\"']vote|\bcast_vote\b"
    ),
    "tool_call_forgery": re.compile(
        r"[\"']tool_calls?[\"']\s*:|</?tool_call>|[\"']function[\"']\s*:\s*\{"
        r"|[\"'](name|peer)[\"']\s*:\s*[\"']talk_to_|[\"']action[\"']\s*:\s*[\"']ask"
        r"|\btalk_to_\w+\s*\("
    ),
    "instruction_phrase": re.compile(
        r"\b(ignore|disregard|forget|override)\s+(all\s+|any\s+)?(of\s+)?(the\s+|your\s+|my\s+)?"
        r"(previous\s+|prior\s+|above\s+|earlier\s+|preceding\s+|original\s+|other\s+)?"
        r"(instructions|rules|directions|prompts?|guidelines|task)\b"
        r"|\bnew\s+(instructions|rules|task)\s*:"
        r"|\byou\s+(must|should|have\s+to|are\s+(required|instructed)\s+to)\s+(now\s+)?vote\b"
        r"|\bvote\s+(for|against)\b"
        r"|\b(set|mark)\s+(the\s+)?location\b"
        r"|\bthe\s+(correct|real|true|only)\s+(answer|culprit|root\s+cause|vote)\s+is\b"
    ),
}
# Checked on the text as written.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)
_CONFUSABLE = re.compile(
    # fullwidth forms, mathematical letters and brackets, CJK brackets, angle quotes and brackets
    "[\uff01-\uff5e\U0001d400-\U0001d7ff\u27e6-\u27ef\u2460-\u24ff\u3008-\u301b\u2039\u203a"
    "\u226a\u226b]"
    r"|\b(?=\w*[a-zA-Z])(?=\w*[\u0370-\u03ff\u0400-\u04ff])\w+"  # Latin mixed with look-alikes
)
_LOOKALIKES = str.maketrans(
    "аеорсухіјѕԁАВЕКМНОРСТХІЈЅοαειντκρΟΑΒΕΗΙΚΜΝΡΤΧΥΖ",
    "aeopcyxijsdABEKMHOPCTXIJSoaeivtkpOABEHIKMNPTXYZ",
)


class InjectionFinding(Frozen):
    """One sign of an attempt: where it was found and what it looked like (for a control
    token, the template families whose spelling it is)."""

    where: str
    kind: FindingKind
    families: tuple[str, ...] = ()

    def __str__(self) -> str:
        named = f" ({', '.join(self.families)})" if self.families else ""
        return f"{self.where}: {self.kind}{named}"


def kinds_in(text: str, controls: ControlTokens = BUILT_IN) -> list[FindingKind]:
    """The kinds of injection sign `text` shows, in FINDING_KINDS order."""
    return [finding.kind for finding in findings_in("", text, controls)]


def findings_in(
    where: str, text: str, controls: ControlTokens = BUILT_IN
) -> list[InjectionFinding]:
    """The signs `text` shows, one finding per kind, in FINDING_KINDS order."""
    families = controls.families_in(text)
    return [
        InjectionFinding(
            where=where, kind=kind, families=tuple(families) if kind == "control_token" else ()
        )
        for kind in _kinds(text, bool(families))
    ]


def _kinds(text: str, control_token: bool) -> list[FindingKind]:
    found: set[FindingKind] = {"control_token"} if control_token else set()
    if _HIDDEN.search(text):
        found.add("hidden_characters")
    if not text.isascii() and _CONFUSABLE.search(text):
        found.add("confusable_characters")
    folded = _folded(text)
    found.update(kind for kind, pattern in _FOLDED.items() if pattern.search(folded))
    return [kind for kind in FINDING_KINDS if kind in found]


def scan(
    messages: Sequence[AgentMessage],
    quoted: Iterable[tuple[str, str]] = (),
    controls: ControlTokens = BUILT_IN,
) -> tuple[InjectionFinding, ...]:
    """Findings in a session (each message's content, and the names its client chose) and in
    the other `quoted` texts, given as (where, text) pairs: the reason, a rule's summary...;
    `controls` are the serving model's control spellings (the built-in families' at least)."""
    return tuple(
        finding
        for where, text in (*_message_texts(messages), *quoted)
        for finding in findings_in(where, text, controls)
    )


def listed(findings: Sequence[InjectionFinding]) -> tuple[str, ...]:
    """The findings as the record lists them: unique, at most MAX_LISTED, then how many more."""
    unique = list(dict.fromkeys(str(f) for f in findings))
    if len(unique) <= MAX_LISTED:
        return tuple(unique)
    return (*unique[:MAX_LISTED], f"(+{len(unique) - MAX_LISTED} more findings not listed)")


def _message_texts(messages: Sequence[AgentMessage]) -> Iterator[tuple[str, str]]:
    for m in messages:
        where = f"message #{m.index}"
        parts = [m.content, m.tool_name, *m.tool_calls]
        if m.kind is not MessageKind.AGENT:  # an agent's sender is checked against the spec
            parts.append(m.sender)
        yield where, "\n".join(p for p in parts if p)


def _folded(text: str) -> str:
    """`text` as the patterns read it; every kind of line break is a newline, so ^ sees it."""
    text = "\n".join(text.splitlines())
    if text.isascii():
        return text.casefold()
    text = unicodedata.normalize("NFKC", text)
    text = "".join(
        ch for ch in text if ch in "\t\n" or not unicodedata.category(ch).startswith("C")
    )
    return text.translate(_LOOKALIKES).casefold()
