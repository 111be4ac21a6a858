"""The flagship demo (programs/json_extraction.py) prints the sample's own data.

Each line of programs/data/people.txt states one person's name, age and city; the
record printed for it must carry exactly those: the age is the one number in the line,
the name and the city are words of the line. These are the sample's facts, not model
knowledge (the real SmolLM2 model on CPU, greedy).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from programs import json_extraction

pytestmark = pytest.mark.model

SAMPLE = Path(json_extraction.__file__).parent / "data" / "people.txt"


def _facts(line: str) -> tuple[int, set[str]]:
    """The line's one number, and its capitalised words (where the name and city are)."""
    [number] = re.findall(r"\d+", line)
    return int(number), set(re.findall(r"[A-Z][a-z]+", line))


def test_the_demo_prints_each_lines_own_name_age_and_city(embedded_backend, capsys):
    lines = [line.strip() for line in SAMPLE.read_text().splitlines() if line.strip()]
    assert json_extraction.main([str(SAMPLE)], backend=embedded_backend) == 0
    out, err = capsys.readouterr()
    records = [json.loads(r) for r in out.splitlines()]
    assert f"{len(lines)} of {len(lines)} records extracted and validated" in err
    assert len(records) == len(lines)
    for line, record in zip(lines, records, strict=True):
        age, words = _facts(line)
        assert record["age"] == age, (line, record)
        assert record["name"] in line and set(record["name"].split()) <= words, (line, record)
        assert record["city"] in line and record["city"] in words, (line, record)
        assert record["name"] != record["city"]


def test_the_few_shot_examples_are_valid_records_of_their_own_text():
    for text, person in json_extraction.EXAMPLES:
        age, words = _facts(text)
        assert person.age == age and person.name in text and person.city in words
