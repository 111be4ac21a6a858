"""Batch JSON extraction with a pydantic model: validated, typed records.

    python -m programs.json_extraction [FILE]

reads one text per line (default: programs/data/people.txt), extracts a ``Person``
from each, and prints one validated JSON record per line. A record whose output fails
validation is reported on stderr with its raw text, never printed as data.
"""

import sys
from pathlib import Path

from pydantic import BaseModel, Field

import structgen as sg


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=150)
    city: str = Field(max_length=40)


@sg.program
def extract_person(s, text):
    s += sg.system("You extract data as JSON.")
    s += sg.user("Extract the person's name, age and city from: " + text)
    s += sg.assistant(sg.gen("person", json_schema=Person, max_tokens=64))


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path(__file__).parent / "data" / "people.txt"
    texts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    states = extract_person.run_batch([{"text": t} for t in texts])
    failed = 0
    for text, state in zip(texts, states):
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
