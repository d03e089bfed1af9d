"""A safe calculator for the Calc-X agent: exact rational arithmetic over a small expression language.

The expression is parsed with `ast` and walked node by node; nothing is ever `eval`ed, and only the nodes below
are accepted (a name, an attribute, a subscript, a call of anything but the listed functions is an error).

Accepted:
- numbers: `12`, `3.5`, `.5`, `1e3`, `3_828` (`_` separators), `1,200` (comma thousands, only in expressions
  without function calls, where a comma cannot separate arguments), percentages `20%` (= 20/100; a `%` followed
  by a number or `(` stays the modulo operator: `7 % 3`);
- operators `+ - * / // % **` and parentheses, unary `+`/`-`; also `×`, `·`, `x` between numbers for `*`,
  `÷` and `:` for `/`, `^` for `**` (models and textbooks write them);
- functions `sqrt abs round floor ceil min max` and the constant `pi`.

Numbers are `fractions.Fraction`, so `1/3*3` is exactly 1; `sqrt`, `pi` and non-integer powers give floats.
Limits keep every input cheap: the expression is at most `MAX_LENGTH` characters and `MAX_NODES` syntax nodes,
an exponent is at most `MAX_EXPONENT` in size and a power may not exceed `MAX_BITS` bits, and every intermediate
value must fit in `MAX_BITS` bits (numerator and denominator), so `9**9**9` or `10**400**2` fail at once.

Output, as in Calc-X's chains (`format_value`): an integer plainly with `_` thousands (`17_280`); a fraction
from exact arithmetic as `2/3 = around 0.666667` (6 decimals); a result that involved a decimal literal or a
float as a decimal (`2.7/3` → `0.9`, `5.20/4` → `1.3`), as Calc-X's sympy Floats print.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MAX_LENGTH = 300
MAX_NODES = 200
MAX_EXPONENT = 1_000
MAX_BITS = 4_096


class CalculatorError(ValueError):
    """The expression cannot be evaluated; the message says why in a few words the model can act on."""


@dataclass(frozen=True)
class Value:
    number: Fraction | float
    decimal: bool = False  # a decimal literal or a float took part: show the result as a decimal


_FUNCTIONS = ("sqrt", "abs", "round", "floor", "ceil", "min", "max")
_CONSTANTS = {"pi": math.pi}

_SYMBOLS = str.maketrans({"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-", "^": "**"})
_TIMES_X = re.compile(r"(?<=[\d)])\s*[xX]\s*(?=[\d(.])")
_RATIO = re.compile(r"(?<=[\d)])\s*:\s*(?=[\d(.])")
_PERCENT = re.compile(r"(\d[\d_]*(?:\.\d+)?|\.\d+)\s*%(?!\s*[\d(.])")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")


def normalize(expression: str) -> str:
    """The expression in Python's syntax: other operator symbols, percentages and comma thousands rewritten."""
    text = expression.strip().translate(_SYMBOLS)
    text = _TIMES_X.sub("*", text)
    text = _RATIO.sub("/", text)
    text = _PERCENT.sub(r"(\1/100)", text)
    if not re.search(r"[A-Za-z_]\s*\(", text):
        text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    return text


def evaluate(expression: str) -> Value:
    """The value of `expression`; raises CalculatorError with a short reason."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression too long ({len(expression)} characters, at most {MAX_LENGTH})")
    text = normalize(expression)
    if not text:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression.strip()!r}") from None
    except (ValueError, RecursionError, MemoryError):
        raise CalculatorError("cannot parse the expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression too complex (more than {MAX_NODES} parts)")
    return _Walker(text).value(tree.body)


def calculate(expression: str) -> str:
    """`evaluate` then `format_value`: the text the agent's tool returns."""
    return format_value(evaluate(expression))


def format_value(value: Value) -> str:
    number = value.number
    if isinstance(number, float):
        if number.is_integer() and abs(number) < 1e15:
            return f"{int(number):_}"
        return _decimal_text(number)
    if number.denominator == 1:
        return f"{number.numerator:_}"
    try:
        approximate = float(number)
    except OverflowError:  # beyond floats (up to MAX_BITS bits): the exact fraction alone
        return str(number)
    if value.decimal:
        return _decimal_text(approximate)
    return f"{number} = around {_around(approximate)}"


def _decimal_text(x: float) -> str:
    return format(x, "_.15g")


def _around(x: float) -> str:
    text = format(x, "_.6f").rstrip("0").rstrip(".")
    if text in ("0", "-0"):  # smaller than the 6 decimals show
        return format(x, ".6g")
    return text


def _check_size(number: Fraction | float) -> Fraction | float:
    if isinstance(number, float):
        if math.isnan(number) or math.isinf(number):
            raise CalculatorError("result is not a finite number")
        return number
    if number.numerator.bit_length() > MAX_BITS or number.denominator.bit_length() > MAX_BITS:
        raise CalculatorError("number too large")
    return number


class _Walker:
    def __init__(self, source: str) -> None:
        self.source = source

    def value(self, node: ast.expr) -> Value:
        result = self._value(node)
        return Value(_check_size(result.number), result.decimal)

    def _value(self, node: ast.expr) -> Value:
        if isinstance(node, ast.Constant):
            return self._constant(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            operand = self.value(node.operand)
            return operand if isinstance(node.op, ast.UAdd) else Value(-operand.number, operand.decimal)
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.Name):
            if node.id in _CONSTANTS:
                return Value(_CONSTANTS[node.id], True)
            if node.id in _FUNCTIONS:
                raise CalculatorError(f"{node.id} is a function: write {node.id}(...)")
            raise CalculatorError(f"unknown name {node.id!r}")
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Tuple):
            raise CalculatorError("several values given: write one expression")
        if isinstance(node, ast.Attribute):
            raise CalculatorError("attribute access is not allowed")
        raise CalculatorError(f"unsupported syntax: {type(node).__name__}")

    def _constant(self, node: ast.Constant) -> Value:
        raw = node.value
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise CalculatorError(f"not a number: {raw!r}"[:80])
        # Read the literal's own text so that 0.1 is exactly 1/10, not the float nearest to it.
        text = (ast.get_source_segment(self.source, node) or repr(raw)).replace("_", "")
        exponent = re.search(r"[eE]([+-]?\d+)", text)
        if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:  # Fraction("1e99999999") would take ages
            raise CalculatorError("number too large")
        try:
            number = Fraction(text)
        except (ValueError, ZeroDivisionError):
            number = Fraction(raw)
        return Value(number, isinstance(raw, float))

    def _binary(self, node: ast.BinOp) -> Value:
        left = self.value(node.left)
        if isinstance(node.op, ast.Pow):
            return self._power(left, self.value(node.right))
        right = self.value(node.right)
        operation = _ARITHMETIC.get(type(node.op))
        if operation is None:
            raise CalculatorError(f"unsupported operator: {type(node.op).__name__}")
        decimal = left.decimal or right.decimal
        try:
            if isinstance(left.number, float) or isinstance(right.number, float):
                return Value(float(operation(float(left.number), float(right.number))), True)
            return Value(Fraction(operation(left.number, right.number)), decimal)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("number too large") from None

    def _power(self, base: Value, exponent: Value) -> Value:
        decimal = base.decimal or exponent.decimal
        e = exponent.number
        if e > MAX_EXPONENT or e < -MAX_EXPONENT:
            raise CalculatorError(f"exponent too large (at most {MAX_EXPONENT})")
        if isinstance(e, Fraction) and e.denominator == 1 and isinstance(base.number, Fraction):
            b = base.number
            bits = max(b.numerator.bit_length(), b.denominator.bit_length()) * abs(int(e))
            if bits > MAX_BITS:
                raise CalculatorError("number too large")
            if b == 0 and e < 0:
                raise CalculatorError("division by zero")
            return Value(b ** int(e), decimal)
        b_float, e_float = float(base.number), float(e)
        if b_float < 0 and not e_float.is_integer():
            raise CalculatorError("fractional power of a negative number")
        if b_float == 0 and e_float < 0:
            raise CalculatorError("division by zero")
        try:
            return Value(math.pow(b_float, e_float), True)
        except OverflowError:
            raise CalculatorError("number too large") from None

    def _call(self, node: ast.Call) -> Value:
        if not isinstance(node.func, ast.Name):
            raise CalculatorError("only the functions " + ", ".join(_FUNCTIONS) + " can be called")
        name = node.func.id
        if name not in _FUNCTIONS:
            raise CalculatorError(f"unknown function {name!r} (known: {', '.join(_FUNCTIONS)})")
        if node.keywords:
            raise CalculatorError(f"{name}() takes no keyword arguments")
        args = [self.value(arg) for arg in node.args]
        return _call_function(name, args)


def _call_function(name: str, args: list[Value]) -> Value:
    decimal = any(a.decimal for a in args)
    if name in ("min", "max"):
        if not args:
            raise CalculatorError(f"{name}() needs at least one number")
        pick = min if name == "min" else max
        return pick(args, key=lambda a: a.number)
    if name == "round":
        if len(args) not in (1, 2):
            raise CalculatorError("round() takes a number and optionally a count of decimals")
        digits = 0
        if len(args) == 2:
            d = args[1].number
            if not (isinstance(d, Fraction) and d.denominator == 1 and 0 <= d <= 15):
                raise CalculatorError("round(): decimals must be a whole number from 0 to 15")
            digits = int(d)
        x = args[0].number
        if isinstance(x, float):
            return Value(round(x, digits), True)
        return Value(Fraction(round(x, digits)), decimal or digits > 0)
    if len(args) != 1:
        raise CalculatorError(f"{name}() takes exactly one number")
    (arg,) = args
    x = arg.number
    if name == "abs":
        return Value(-x if x < 0 else x, arg.decimal)
    if name in ("floor", "ceil"):
        return Value(Fraction(math.floor(x) if name == "floor" else math.ceil(x)), False)
    # sqrt: exact for perfect squares of rationals (sqrt(9/4) = 3/2), a float otherwise
    if x < 0:
        raise CalculatorError("square root of a negative number")
    if isinstance(x, Fraction):
        n, d = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if n * n == x.numerator and d * d == x.denominator:
            return Value(Fraction(n, d), arg.decimal)
    return Value(math.sqrt(x), True)


_ARITHMETIC: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,  # Fraction // Fraction is an int: made a Fraction again below
    ast.Mod: operator.mod,
}
