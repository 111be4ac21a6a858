"""A calculator + unit-conversion agent: typed tools, the loop, no eval.

``calculate`` evaluates arithmetic by walking Python's AST over numbers and + - * / ** %
only (anything else is an error result the model sees); ``convert`` converts between
length, mass and temperature units.
"""

from __future__ import annotations

import ast
import operator
from typing import Literal

import structgen as sg

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}
_FACTORS = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mi": 1609.344, "ft": 0.3048,
            "g": 1.0, "kg": 1000.0, "lb": 453.59237}
_KIND = {"m": "length", "km": "length", "cm": "length", "mi": "length", "ft": "length",
         "g": "mass", "kg": "mass", "lb": "mass", "C": "temperature", "F": "temperature", "K": "temperature"}
Unit = Literal["m", "km", "cm", "mi", "ft", "g", "kg", "lb", "C", "F", "K"]


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))  # type: ignore[no-any-return]
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


@sg.tool
def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression with numbers and + - * / ** % and parentheses.

    Args:
        expression: for example "(3 + 4) * 2"
    """
    if len(expression) > 200:
        raise ValueError("expression too long")
    return _eval(ast.parse(expression, mode="eval"))


@sg.tool
def convert(value: float, from_unit: Unit, to_unit: Unit) -> float:
    """Convert a value between units of length (m km cm mi ft), mass (g kg lb) or temperature (C F K)."""
    if _KIND[from_unit] != _KIND[to_unit]:
        raise ValueError(f"cannot convert {_KIND[from_unit]} to {_KIND[to_unit]}")
    if _KIND[from_unit] == "temperature":
        kelvin = {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[from_unit]
        return {"C": kelvin - 273.15, "F": (kelvin - 273.15) * 9 / 5 + 32, "K": kelvin}[to_unit]
    return value * _FACTORS[from_unit] / _FACTORS[to_unit]


TOOLS = [calculate, convert]
agent = sg.Agent(TOOLS, name="calculator", system="You solve arithmetic and unit questions with the tools, "
                 "then answer briefly.", max_steps=3, max_tokens=96)


if __name__ == "__main__":
    state = agent.run("How many feet is 3 km, and what is 17 * 23?")
    print(state.text())
    for step in state.value("answer").steps:
        print(step)
