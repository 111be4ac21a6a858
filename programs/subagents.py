"""Parallel sub-agents through ``fork``: one sub-agent per topic, then a summary.

The parent shows the tools and a shared system prompt once; ``s.fork(n)`` gives each
sub-agent that prefix (computed once), each gets its own question, and ``run_tools`` runs
them in lockstep -- their turns are generated as one batch, their calls run together.
"""

from __future__ import annotations

import structgen as sg

FACTS = {"paris": "Paris is the capital of France.", "tokyo": "Tokyo is the capital of Japan.",
         "lima": "Lima is the capital of Peru.", "nairobi": "Nairobi is the capital of Kenya."}


@sg.tool
def encyclopedia(topic: str) -> str:
    """Look a topic up in a small encyclopedia."""
    return FACTS.get(topic.strip().lower(), f"no entry for {topic!r}")


@sg.program
def research(s, topics):
    s += sg.use_tools([encyclopedia])
    s += sg.system("You are a research assistant. Look the topic up, then state one fact.")
    forks = s.fork(len(topics))
    forks += lambda i: sg.user(f"Topic: {topics[i]}")
    results = sg.run_tools(forks, [encyclopedia], name="finding", max_steps=2, max_tokens=64,
                           parallel_tool_calls=False)  # one lookup per topic
    s["findings"] = [r.answer or "" for r in results]
    s["steps"] = [len(r.steps) for r in results]
    s += sg.user("Summarize these findings in one sentence: " + " | ".join(s["findings"]))
    s += sg.assistant(sg.gen("summary", max_tokens=48, stop="\n"))


if __name__ == "__main__":
    state = research.run(topics=["Paris", "Tokyo", "Lima"])
    print(state["findings"], state["summary"])
