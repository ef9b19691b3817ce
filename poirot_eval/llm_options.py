"""The LLM options every harness command that runs a model takes (`eval run`, `campaign run`),
and the backend spec they name: one definition, so the commands cannot drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import TypeAdapter, ValidationError

from poirotd.config import LLMSpec
from poirotd.llm import LLMError

ModelPathOption = Annotated[
    Path | None, typer.Option(help="embedded: GGUF file (default: the shipped SmolLM2-135M)")
]
ContextTokensOption = Annotated[
    int | None, typer.Option(min=512, help="context window (default: the backend's)")
]
ThreadsOption = Annotated[int | None, typer.Option(min=1, help="embedded: CPU threads")]
BaseUrlOption = Annotated[
    list[str] | None,
    typer.Option(help="OpenAI-compatible server (vLLM); repeat to fail over; needs --model"),
]
ModelOption = Annotated[str | None, typer.Option(help="the served model's name")]
StructuredOutput = Literal["json_schema", "json_object"]
StructuredOutputOption = Annotated[
    StructuredOutput,
    typer.Option(help="server: json_schema (vLLM, OpenAI) or json_object (llama.cpp's server)"),
]


def llm_spec(
    model_path: Path | None,
    context_tokens: int | None,
    threads: int | None,
    base_urls: list[str] | None,
    model: str | None,
    structured_output: str,
) -> LLMSpec:
    """An OpenAI-compatible server when --base-url is given, else the embedded model."""
    fields: dict[str, object] = {}
    if context_tokens is not None:
        fields["context_tokens"] = context_tokens
    if base_urls:
        if model is None:
            raise typer.BadParameter("--base-url needs --model", param_hint="--model")
        fields |= {
            "backend": "openai",
            "base_urls": base_urls,
            "model": model,
            "structured_output": structured_output,
        }
    else:
        fields |= {"backend": "embedded", "model_path": model_path, "threads": threads}
    try:
        if fields["backend"] == "embedded" and model_path is None:
            # Named in full, so run.json and every result line say which file answered.
            from poirotd.llm.embedded import default_model_path

            fields["model_path"] = default_model_path()
        return TypeAdapter(LLMSpec).validate_python(fields)
    except (LLMError, ValidationError) as exc:
        typer.echo(f"invalid LLM options: {exc}", err=True)
        raise typer.Exit(2) from exc
