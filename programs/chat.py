"""Multi-turn chat with roles, rendered with the tokenizer's own chat template."""

import structgen as sg


@sg.program
def chat(s, questions):
    s += sg.system("You are a concise assistant. Answer in one sentence.")
    for i, q in enumerate(questions):
        s += sg.user(q)
        s += sg.assistant(sg.gen(f"answer_{i}", max_tokens=32, stop="\n"))


if __name__ == "__main__":
    state = chat.run(questions=["What is a prime number?", "Give an example."])
    for m in state.messages():
        print(f"{m['role']:>9}: {m['content']}")
