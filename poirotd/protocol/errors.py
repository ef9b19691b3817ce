"""Failures of the protocol, kept apart from LLM transport errors (`poirotd.llm.LLMError`)."""

from __future__ import annotations

from poirotd.model import LLMUsage


class ProtocolError(Exception):
    """The investigation cannot produce an attribution; the message tells the operator why.

    The engine fills in what the failed run spent before the error leaves it, so a failed
    investigation's record still says how many calls and tokens it cost."""

    usage: LLMUsage = LLMUsage()


class AnswerFailedError(Exception):
    """An agent gave no acceptable answer within the retry bound; the message is the reason."""


class ModelUnavailableError(Exception):
    """No LLM server could serve one of the run's calls within the outage budget
    (`poirotd.llm.base.MODEL_UNAVAILABLE`). The run stops there: its other calls would wait as
    long, and an agent that abstained for want of a model would skew the attribution. The engine
    fills in what the run spent, as for ProtocolError."""

    usage: LLMUsage = LLMUsage()
