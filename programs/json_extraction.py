"""Batch JSON extraction with a pydantic model: validated, typed records.

    python -m programs.json_extraction [FILE]

reads one text per line (default: programs/data/people.txt), extracts a ``Person``
from each, and prints one validated JSON record per line. A record whose output fails
validation is reported on stderr with its raw text, never printed as data.

The schema makes every record valid; the few-shot examples (one chat turn each) make the
small default model copy the values from the text instead of inventing them.
"""

import sys
from pathlib import Path

from pydantic import BaseModel, Field

import structgen as sg


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=150)
    city: str = Field(max_length=40)


EXAMPLES = [
    ("Emma Stone is 28 and lives in Paris.", Person(name="Emma Stone", age=28, city="Paris")),
    ("Omar Haddad turned 59 in March; he has always lived in Cairo.", Person(name="Omar Haddad", age=59, city="Cairo")),
    ("Our neighbour Li Wei (34) just moved to Chengdu.", Person(name="Li Wei", age=34, city="Chengdu")),
]
INSTRUCTION = "Extract the person's name, age and city from: "


@sg.program
def extract_person(s, text):
    s += sg.system("You extract data as JSON.")
    for example, person in EXAMPLES:
        s += sg.user(INSTRUCTION + example)
        s += sg.assistant(person.model_dump_json())
    s += sg.user(INSTRUCTION + text)
    s += sg.assistant(sg.gen("person", json_schema=Person, max_tokens=64))


def main(argv: list[str], backend: sg.Backend | None = None) -> int:
    path = Path(argv[0]) if argv else Path(__file__).parent / "data" / "people.txt"
    texts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    states = extract_person.run_batch([{"text": t} for t in texts], backend=backend)
    failed = 0
    for state in states:
        if state.error() is not None:
            failed += 1
            print(f"error: {state.error()}", file=sys.stderr)
            continue
        person: Person = state.value("person")
        print(person.model_dump_json())
    print(f"{len(texts) - failed} of {len(texts)} records extracted and validated", file=sys.stderr)
    return 1 if failed == len(texts) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
