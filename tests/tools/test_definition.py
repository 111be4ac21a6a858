"""Item 1: tools from code -- functions (sync/async) through pydantic, models, OpenAI dicts."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Annotated

import jsonschema
import pytest
from pydantic import BaseModel, Field

import structgen as sg
from structgen.errors import ProgramError
from structgen.tools import ToolArgumentsError, as_tool, as_tools


class Unit(StrEnum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str = "FR"


@sg.tool
def weather(place: Place, unit: Unit = Unit.celsius,
            days: Annotated[int, Field(ge=1, le=7, description="forecast length")] = 1) -> str:
    """Get the weather forecast.

    Args:
        place: where to look
        unit: temperature unit
    """
    return f"{place.city}/{unit.value}/{days}"


@sg.tool(name="slow_add", timeout=3.0)
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await asyncio.sleep(0)
    return a + b


def test_function_tool_schema_from_signature():
    p = weather.parameters
    jsonschema.Draft202012Validator.check_schema(p)
    assert weather.name == "weather" and weather.description == "Get the weather forecast."
    assert p["required"] == ["place"]
    assert p["additionalProperties"] is False
    assert p["properties"]["days"] == {"default": 1, "description": "forecast length", "maximum": 7,
                                       "minimum": 1, "type": "integer"}
    assert p["properties"]["unit"]["description"] == "temperature unit"
    assert p["$defs"]["Unit"]["enum"] == ["celsius", "fahrenheit"]
    assert p["$defs"]["Place"]["additionalProperties"] is False  # nested objects closed too
    assert "title" not in p and "title" not in p["properties"]["days"]
    assert not weather.is_async and add.is_async and add.name == "slow_add" and add.timeout == 3.0


def test_validate_gives_typed_arguments_and_typed_errors():
    args = weather.validate({"place": {"city": "Lyon"}, "unit": "fahrenheit"})
    assert isinstance(args.place, Place) and args.unit is Unit.fahrenheit and args.days == 1
    _, kwargs = weather.bind_arguments(args)
    assert weather(**kwargs) == "Lyon/fahrenheit/1"
    for bad in ({"place": {"city": "Lyon"}, "days": 9}, {"place": {"city": "Lyon"}, "x": 1}, {"unit": "celsius"},
                {"place": {"city": "Lyon"}, "unit": "kelvin"}, ["not", "an", "object"]):
        with pytest.raises(ToolArgumentsError):
            weather.validate(bad)


def test_pydantic_model_and_openai_dict_tools():
    class Answer(BaseModel):
        """The final answer."""

        text: str
        confidence: float

    t = as_tool(Answer)
    assert t.name == "Answer" and t.fn is None and t.description == "The final answer."
    assert isinstance(t.validate({"text": "x", "confidence": 0.5}), Answer)
    spec = {"type": "function", "function": {"name": "lookup", "description": "Look up.", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "title": "Q"}}, "required": ["q"]}}}
    o = as_tool(spec, fn=lambda q: q.upper())
    assert o.parameters == {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
                            "additionalProperties": False}
    assert o.validate({"q": "a"}) == {"q": "a"}
    assert o.openai()["function"]["name"] == "lookup"
    assert as_tool(spec["function"]).name == "lookup"  # the bare function dict too


def test_bad_tools_are_typed_errors():
    with pytest.raises(ProgramError):
        as_tool(lambda x: x)  # no annotation
    with pytest.raises(ProgramError):
        as_tools([weather, weather])
    with pytest.raises(ProgramError):
        as_tool({"type": "function", "function": {"name": "bad name!"}})
    with pytest.raises(ProgramError):
        as_tool(42)


def test_program_as_tool():
    @sg.program
    def summarize(s, text: str, words: int = 5):
        """Summarize a text."""
        s["answer"] = text[:words]

    t = as_tool(summarize)
    assert t.name == "summarize" and t.description == "Summarize a text."
    assert t.parameters["required"] == ["text"] and t.parameters["properties"]["words"]["type"] == "integer"

