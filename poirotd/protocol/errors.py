"""Failures of the protocol, kept apart from LLM transport errors (`poirotd.llm.LLMError`)."""

from __future__ import annotations

from poirotd.model import LLMUsage


class ProtocolError(Exception):
    """The investigation cannot produce an attribution; the message tells the operator why.

    The engine fills in what the failed run spent before the error leaves it, so a failed
    investigation's record still says how many calls and tokens it cost."""

    usage: LLMUsage = LLMUsage()


class AnswerFailed(Exception):
    """An agent gave no acceptable answer within the retry bound; the message is the reason."""
