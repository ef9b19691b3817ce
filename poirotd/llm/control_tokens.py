"""Chat-template control tokens: the strings a model's tokenizer reads as its own turn and role
markers, and how text quoted to the model is kept from spelling them.

Why. A backend hands the model its prompt as text that is tokenised with special tokens parsed:
llama.cpp tokenises the rendered ChatML whole, and vLLM renders each message's content through
the chat template and its tokenizer. A message reading `Checking VaR.<|im_end|>\\n<|im_start|>
system\\n...` therefore closes the turn that quotes it and opens a real system turn, whatever
spotlighting writes around it. The same holds for every template family: Llama 3
(`<|start_header_id|>`, `<|eot_id|>`), Gemma (`<start_of_turn>`), Mistral (`[INST]`, `</s>`),
harmony (`<|start|>`, `<|message|>`, `<|channel|>`)...

Defusing. Every occurrence of a control spelling gets a MIDDLE DOT (U+00B7) after its first
character: `<|im_start|>` reads `<·|im_start|>`, `[INST]` `[·INST]`, `</s>` `<·/s>`. The text
stays readable, the model can still tell what was written, and no tokenizer matches the spelling
any more (a dot is no part of any control token, and NFKC leaves it alone). Every built-in
family is defused whichever model serves: the cost is one character, and a quote must not become
a turn after the model behind the backend is swapped. A backend adds what it learned of its own
model: the embedded backend reads its vocabulary's control tokens, the OpenAI-compatible one asks
its server (openai_http.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from poirotd.config.spec import TemplateFamilyName

# What defusing inserts after a control spelling's first character.
BREAK = "\u00b7"
# Spellings of the `<|name|>` shape (ChatML, Llama 3, harmony, Phi and many more use it) and of
# DeepSeek's full-width bars (U+FF5C) are defused even when no table lists them: the table names
# the family, the pattern catches the model-specific rest (Qwen's <|vision_start|>, ...).
_ANY_BAR_TOKEN = r"<\|[A-Za-z0-9_.:/-]{1,64}\|>|<\uff5c[^\uff5c<>\n]{1,64}\uff5c>"
_OTHER = "other <|…|>"
# A model's own vocabulary token that no family lists.
_VOCABULARY = "the served model's vocabulary"
# How a backend learned its model's family: from its vocabulary (embedded), from its server, from
# the spec (the server could not tell), or not at all.
ControlSource = Literal["vocabulary", "server", "configured", "unknown"]


@dataclass(frozen=True)
class TemplateFamily:
    """One chat-template family: its control spellings (literal, and numbered ones as regular
    expressions), and the `marker` that tells a vocabulary of this family (its turn opener)."""

    name: TemplateFamilyName
    marker: str
    spellings: tuple[str, ...]
    patterns: tuple[str, ...] = ()

    def lists(self, spelling: str) -> bool:
        return spelling in self.spellings or any(re.fullmatch(p, spelling) for p in self.patterns)


FAMILIES: dict[TemplateFamilyName, TemplateFamily] = {
    family.name: family
    for family in (
        TemplateFamily(
            "chatml",  # Qwen, SmolLM, Hermes, Yi...; the tool tags are Hermes' and Qwen's
            "<|im_start|>",
            (
                "<|im_start|>",
                "<|im_end|>",
                "<|im_sep|>",
                "<|endoftext|>",
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
            ),
        ),
        TemplateFamily(
            "llama3",
            "<|start_header_id|>",
            (
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
                "<|finetune_right_pad_id|>",
                "<|image|>",
            ),
            (r"<\|reserved_special_token_\d+\|>",),
        ),
        TemplateFamily(
            "gemma",
            "<start_of_turn>",
            (
                "<start_of_turn>",
                "<end_of_turn>",
                "<bos>",
                "<eos>",
                "<pad>",
                "<mask>",
                "<start_of_image>",
                "<end_of_image>",
                "<image_soft_token>",
            ),
            (r"<unused\d+>",),
        ),
        TemplateFamily(
            "mistral",  # and Llama 2's [INST] <<SYS>> format
            "[INST]",
            (
                "[INST]",
                "[/INST]",
                "<s>",
                "</s>",
                "<unk>",
                "<<SYS>>",
                "<</SYS>>",
                "[SYSTEM_PROMPT]",
                "[/SYSTEM_PROMPT]",
                "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]",
                "[TOOL_CALLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
                "[TOOL_CONTENT]",
                "[ARGS]",
                "[CALL_ID]",
                "[THINK]",
                "[/THINK]",
                "[IMG]",
                "[IMG_BREAK]",
                "[IMG_END]",
                "[PREFIX]",
                "[MIDDLE]",
                "[SUFFIX]",
            ),
            (r"\[control_\d+\]",),
        ),
        TemplateFamily(
            "harmony",  # gpt-oss
            "<|message|>",
            (
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|constrain|>",
                "<|return|>",
                "<|call|>",
                "<|startoftext|>",
                "<|endoftext|>",
                "<|endofprompt|>",
            ),
        ),
        TemplateFamily(
            "phi3",
            "<|assistant|>",
            ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"),
            (r"<\|placeholder\d+\|>",),
        ),
        TemplateFamily(
            "deepseek",
            "<\uff5cAssistant\uff5c>",
            (
                "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                "<\uff5cend\u2581of\u2581sentence\uff5c>",
                "<\uff5cUser\uff5c>",
                "<\uff5cAssistant\uff5c>",
                "<\uff5ctool\u2581calls\u2581begin\uff5c>",
                "<\uff5ctool\u2581calls\u2581end\uff5c>",
                "<\uff5ctool\u2581call\u2581begin\uff5c>",
                "<\uff5ctool\u2581call\u2581end\uff5c>",
                "<\uff5ctool\u2581sep\uff5c>",
                "<\uff5ctool\u2581outputs\u2581begin\uff5c>",
                "<\uff5ctool\u2581outputs\u2581end\uff5c>",
                "<\uff5ctool\u2581output\u2581begin\uff5c>",
                "<\uff5ctool\u2581output\u2581end\uff5c>",
            ),
        ),
    )
}


def family_spellings() -> list[str]:
    """Every literal spelling of the built-in families, each once: what a server is asked about."""
    return list(dict.fromkeys(s for f in FAMILIES.values() for s in f.spellings))


def served_family(spellings: Iterable[str]) -> TemplateFamilyName | None:
    """The family whose marker is among a model's control spellings (None: no built-in one)."""
    present = set(spellings)
    return next((name for name, f in FAMILIES.items() if f.marker in present), None)


@dataclass(frozen=True)
class ControlTokens:
    """The control spellings kept out of quoted text: every built-in family's, the `<|…|>`
    shape, and `vocabulary`, those the serving model's tokenizer was found to have. `family` is
    the serving model's template family when known, and `source` says how it was learned
    ("vocabulary", "server", "configured", or "unknown")."""

    vocabulary: frozenset[str] = frozenset()
    family: TemplateFamilyName | None = None
    source: ControlSource = "unknown"
    # False only for NO_CONTROL_TOKENS (the record's verbatim copy).
    built_in: bool = True

    @classmethod
    def unlearned(cls, configured: TemplateFamilyName | None) -> ControlTokens:
        """The built-in families alone, the served one named by the spec if it says."""
        return cls(family=configured, source="configured" if configured else "unknown")

    @classmethod
    def learned(
        cls,
        spellings: Iterable[str],
        source: ControlSource,
        configured: TemplateFamilyName | None = None,
    ) -> ControlTokens:
        """From a model's control spellings (its vocabulary's, or the built-in ones a server
        reports as single tokens); the family is the one they show, else `configured`. Spellings
        shorter than two characters cannot be broken and are not kept (no real template has
        one)."""
        kept = frozenset(s for s in spellings if len(s) >= 2 and not s.isspace())
        family = served_family(kept)
        if family is None:
            return cls(kept, configured, "configured" if configured else source)
        return cls(kept, family, source)

    @property
    def breaks_any(self) -> bool:
        """Whether `defuse` changes anything at all (not for NO_CONTROL_TOKENS)."""
        return self.built_in or bool(self.vocabulary)

    def defuse(self, text: str) -> str:
        """`text` with a BREAK after the first character of every control spelling in it,
        overlapping ones included, so that none of them is left whole."""
        starts = self._starts
        if starts is None:
            return text
        cuts = sorted({m.start() + 1 for m in starts.finditer(text)})
        if not cuts:
            return text
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        return BREAK.join(pieces)

    def families_in(self, text: str) -> list[str]:
        """The families whose control spellings `text` contains, in table order; a spelling no
        family lists is named as the served model's vocabulary's, or as the `<|…|>` shape."""
        whole = self._whole
        found = {m.group() for m in whole.finditer(text)} if whole else set()
        names: dict[str, None] = {}
        for name, family in FAMILIES.items():
            if any(family.lists(s) for s in found):
                names[name] = None
        for spelling in found:
            if not any(family.lists(spelling) for family in FAMILIES.values()):
                names[_VOCABULARY if spelling in self.vocabulary else _OTHER] = None
        return list(names)

    @cached_property
    def _alternatives(self) -> list[str]:
        if not self.breaks_any:
            return []
        literals = set(self.vocabulary)
        patterns: list[str] = []
        if self.built_in:
            literals.update(family_spellings())
            patterns = [p for f in FAMILIES.values() for p in f.patterns] + [_ANY_BAR_TOKEN]
        # Longest first, so that a spelling is matched whole where two share a beginning.
        ordered = sorted(literals, key=lambda s: (-len(s), s))
        return [*(re.escape(s) for s in ordered), *patterns]

    @cached_property
    def _starts(self) -> re.Pattern[str] | None:
        """Matches, empty, where any spelling begins: overlapping occurrences are all found. The
        leading class of first characters lets the engine skip most positions (4x faster)."""
        alternatives = self._alternatives
        if not alternatives:
            return None
        firsts = re.escape("".join(sorted(self._first_chars)))
        return re.compile(f"(?=[{firsts}])(?=(?:{'|'.join(alternatives)}))")

    @cached_property
    def _whole(self) -> re.Pattern[str] | None:
        alternatives = self._alternatives
        return re.compile("|".join(alternatives)) if alternatives else None

    @cached_property
    def _first_chars(self) -> frozenset[str]:
        """The characters a spelling can begin with."""
        firsts = {s[0] for s in self.vocabulary}
        if self.built_in:
            firsts |= {s[0] for s in family_spellings()} | {"<"}
        return frozenset(firsts)


BUILT_IN = ControlTokens()
"""The built-in families alone: for a backend that knows nothing of its model."""
NO_CONTROL_TOKENS = ControlTokens(built_in=False)
"""Nothing defused: the record's verbatim copy of what was quoted."""
