"""Classification with select: the label is scored by log-probabilities, never free text."""

import structgen as sg

LABELS = ["positive", "negative", "neutral"]


@sg.program
def classify(s, review):
    s += sg.user(f"Classify the sentiment of this review as positive, negative or neutral.\n\n{review}")
    s += sg.assistant("Sentiment: " + sg.select("label", choices=LABELS))


if __name__ == "__main__":
    print(classify.run(review="The battery died after two days.")["label"])
