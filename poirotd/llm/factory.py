"""Builds the configured LLM backend (scripted backends are for tests and are never built here)."""

from __future__ import annotations

from poirotd.config import LLMSpec, OpenAILLMSpec
from poirotd.llm.base import LLMBackend


async def open_backend(spec: LLMSpec) -> LLMBackend:
    if isinstance(spec, OpenAILLMSpec):
        from poirotd.llm.openai_http import OpenAIBackend

        return await OpenAIBackend.open(spec)
    # Imported here: the embedded backend pulls in llama.cpp, an optional extra.
    from poirotd.llm.embedded import EmbeddedBackend

    return await EmbeddedBackend.load(spec)
