"""Few-shot question answering: a fixed prefix of examples, one generated answer."""

import structgen as sg

EXAMPLES = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
]


@sg.program
def few_shot_qa(s, question):
    s += "Answer each question in one or two words.\n\n"
    for q, a in EXAMPLES:
        s += f"Q: {q}\nA: {a}\n\n"
    s += f"Q: {question}\nA:" + sg.gen("answer", max_tokens=12, stop="\n")


if __name__ == "__main__":
    print(few_shot_qa.run(question="What is the capital of Germany?")["answer"].strip())
