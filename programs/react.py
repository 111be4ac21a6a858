"""A ReAct agent loop: the action is a select, its argument a constrained gen.

The argument's regex keeps ``]`` and newlines out of it but lets the model close the
bracket: ``stop="]"`` ends the argument there (the stop text is not kept). One worked
example shows the format.
"""

import structgen as sg

ACTIONS = ["Search", "Calculate", "Finish"]
TOOLS = {
    "Search": lambda q: f"(search results for {q!r}: no further information)",
    "Calculate": lambda q: "(calculator: cannot evaluate)",
}


ARG_REGEX = r"[^\]\n]{1,40}\]?"
EXAMPLE = ("Question: What is the capital of the country where the Eiffel Tower stands?\n"
           "Thought 1: The Eiffel Tower is in Paris, France. The capital of France is Paris.\n"
           "Action 1: Finish[Paris]\n\n")


@sg.program
def react(s, question, max_steps=3):
    s += ("Solve the task with Thought, Action and Observation steps. Actions: "
          "Search[query], Calculate[expression], Finish[answer].\n\n")
    s += EXAMPLE
    s += f"Question: {question}\n"
    for step in range(1, max_steps + 1):
        s += f"Thought {step}:" + sg.gen(f"thought_{step}", max_tokens=24, stop="\n") + "\n"
        s += f"Action {step}: " + sg.select(f"action_{step}", choices=ACTIONS)
        s += "[" + sg.gen(f"arg_{step}", regex=ARG_REGEX, stop="]", max_tokens=16) + "]\n"
        action = s[f"action_{step}"]
        if action == "Finish":
            s["answer"] = s[f"arg_{step}"]
            s["steps"] = step
            return
        s += f"Observation {step}: {TOOLS[action](s[f'arg_{step}'])}\n"
    s["answer"] = None
    s["steps"] = max_steps


if __name__ == "__main__":
    state = react.run(question="What is the tallest mountain in Europe?")
    print(state.text())
