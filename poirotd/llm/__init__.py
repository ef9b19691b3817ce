"""LLM backends: one async chat interface, several ways to serve it."""

from poirotd.llm.base import ChatMessage, Completion, LLMBackend, LLMError

__all__ = ["ChatMessage", "Completion", "LLMBackend", "LLMError"]
