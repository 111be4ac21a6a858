"""dtype generation: typed int / float / bool / str values.

One worked example shows the format. The string's prompt ends without a space: the
constraint's opening quote then follows as the model would write it (after a trailing
space the small model tends to close the quotes at once).
"""

import structgen as sg

EXAMPLE = ("Facts about a horse.\nNumber of legs: 4\nAverage weight in kg: 500.0\n"
           "Is it a mammal (True or False)? True\nName:\"horse\"\n\n")


@sg.program
def facts(s, thing):
    s += EXAMPLE
    s += f"Facts about {thing}.\n"
    s += "Number of legs: " + sg.gen_int("legs", max_tokens=4) + "\n"
    s += "Average weight in kg: " + sg.gen("weight", dtype=float, max_tokens=8) + "\n"
    s += "Is it a mammal (True or False)? " + sg.gen("mammal", dtype=bool) + "\n"
    s += "Name:" + sg.gen_string("name", max_tokens=10) + "\n"


if __name__ == "__main__":
    state = facts.run(thing="a cat")
    print(state.values())
