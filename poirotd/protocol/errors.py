"""Failures of the protocol, kept apart from LLM transport errors (`poirotd.llm.LLMError`)."""

from __future__ import annotations


class ProtocolError(Exception):
    """The investigation cannot produce an attribution; the message tells the operator why."""


class AnswerFailed(Exception):
    """An agent gave no acceptable answer within the retry bound; the message is the reason."""
