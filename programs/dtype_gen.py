"""dtype generation: typed int / float / bool / str values."""

import structgen as sg


@sg.program
def facts(s, thing):
    s += f"Facts about {thing}.\n"
    s += "Number of legs: " + sg.gen_int("legs", max_tokens=4) + "\n"
    s += "Average weight in kg: " + sg.gen("weight", dtype=float, max_tokens=8) + "\n"
    s += "Is it a mammal (True or False)? " + sg.gen("mammal", dtype=bool) + "\n"
    s += "Its name in quotes: " + sg.gen_string("name", max_tokens=10) + "\n"


if __name__ == "__main__":
    state = facts.run(thing="a cat")
    print(state.values())
