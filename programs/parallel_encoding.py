"""Parallel encoding: documents are encoded in forks, then concatenated into the parent."""

import structgen as sg


@sg.program
def answer_from_docs(s, docs, question):
    s += "Read the documents and answer the question.\n"
    forks = s.fork(len(docs))
    forks += [f"Document {i + 1}: {d}\n" for i, d in enumerate(docs)]
    forks.join(mode="concate_and_append")
    s += f"Question: {question}\nAnswer:" + sg.gen("answer", max_tokens=24, stop="\n")


if __name__ == "__main__":
    state = answer_from_docs.run(docs=["The sky is blue.", "Grass is green."],
                                 question="What color is grass?")
    print(state["answer"].strip())
