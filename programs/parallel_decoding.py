"""Parallel decoding with fork/join (skeleton-of-thought): expand several points at once."""

import structgen as sg


@sg.program
def tips(s, topic, n=3):
    s += f"Here are {n} short tips for {topic}:\n"
    forks = s.fork(n)
    forks += lambda i: f"{i + 1}." + sg.gen("tip", max_tokens=32, stop="\n")
    forks.join()  # s["tip"] is now the list of the children's tips
    s += "In summary," + sg.gen("summary", max_tokens=32, stop="\n")


if __name__ == "__main__":
    state = tips.run(topic="staying healthy")
    for t in state["tip"]:
        print("-", t.strip())
    print("In summary,", state["summary"].strip())
