"""Runs one case through poirot-framework 0.2.0's full mode (C3), for bench/tta.py.

Executed by the library's own venv, so it imports nothing from poirotd: the job arrives as JSON
on stdin and the result leaves as one JSON line on stdout (the library's progress goes to
stderr). Three settings the library does not expose are set here, each to what poirotd gets:
- the server: provider "local" always talks to LLMFactory.DEFAULT_LOCAL_BASE_URL;
- the per-call token limit: Phase 2 creates its chat models without one, and langchain-openai
  sends a model's limit as `max_completion_tokens`, which llama-cpp-python's server ignores (it
  then generates until the context is full); so every model gets the job's limit, also as
  `max_tokens` in the request body, the field that server reads;
- the error space: run_poirot_from_agents always builds it (Phase 0), so Phase 0 returns the
  supplied one, as run_poirot does when it finds one saved in its output directory.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Build the agents as a LangChain user would, run C3, time the attribution."""
    import poirot
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent
    from poirot.llm_factory import LLMFactory
    from poirot.poirot_agent import POIROTAgent

    limit = job["max_tokens"]
    LLMFactory.DEFAULT_LOCAL_BASE_URL = job["base_url"]
    create = LLMFactory.create_chat_llm.__func__

    enforced = {"max_tokens": limit, "extra_body": {"max_tokens": limit}}

    def create_limited(cls: type, *args: Any, **kwargs: Any) -> Any:
        return create(cls, *args, **(kwargs | enforced))

    LLMFactory.create_chat_llm = classmethod(create_limited)
    space = job["error_space"]
    POIROTAgent.analyze_system = lambda self, *args, **kwargs: space

    adapters = []
    for agent in job["agents"]:
        history: list[BaseMessage] = [
            AIMessage(content=m["content"])
            if m["own"]
            else HumanMessage(content=m["content"], name=m["sender"])
            for m in agent["messages"]
        ]
        model = ChatOpenAI(
            model=job["model"],
            base_url=job["base_url"],
            api_key="none",
            temperature=0,
            **enforced,
        )
        adapters.append(
            poirot.LangChainAgentAdapter(
                agent=create_react_agent(model, tools=[], prompt=agent["system_prompt"]),
                messages=history,
                agent_id=agent["id"],
                agent_name=agent["name"],
                system_prompt=agent["system_prompt"],
            )
        )

    started = time.monotonic()
    result = poirot.run_poirot_from_agents(
        agents=adapters,
        system_name=job["system_name"],
        system_description=job["system_description"],
        provider="local",
        model=job["model"],
        mode="C3",
        verbose=True,
    )
    seconds = time.monotonic() - started
    return {
        "seconds": seconds,
        "votes": {aid: r["vote"] for aid, r in result["agent_reports"].items()},
        "consensus": result["consensus"],
    }


def main() -> None:
    job = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):
        outcome = run(job)
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
