"""The Calc-X calculator: exact arithmetic, Calc-X's output format, refusals (unsafe or too costly input), and a
check against the data: the calculator must reproduce the `<output>` of the calculator calls in the chains."""

from __future__ import annotations

import json
import re
import time
from fractions import Fraction

import pytest

from agl_bench.calc_x.calculator import MAX_LENGTH, CalculatorError, calculate, evaluate
from agl_bench.datasets import datasets_root

GADGET = re.compile(r'<gadget id="calculator">(.*?)</gadget>\s*<output>(.*?)</output>', re.S)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1/3*3", Fraction(1)),
        ("2+3*4", Fraction(14)),
        ("(2+3)*4", Fraction(20)),
        ("2**3**2", Fraction(512)),  # right-associative, as in mathematics
        ("-2**2", Fraction(-4)),
        ("(-2)**2", Fraction(4)),
        ("10-4-3", Fraction(3)),
        ("48/4/2", Fraction(6)),
        ("3_700 + 128", Fraction(3828)),
        ("1,200 + 5", Fraction(1205)),
        ("0.1 + 0.2", Fraction(3, 10)),  # exact: decimals are read as fractions, not floats
        ("1 / (3/2)", Fraction(2, 3)),
        ("20% * 50", Fraction(10)),
        ("17 % 5", Fraction(2)),
        ("17 // 5", Fraction(3)),
        ("2^10", Fraction(1024)),
        ("3 x 4 × 2", Fraction(24)),
        ("36 ÷ 4", Fraction(9)),
        ("2**-2", Fraction(1, 4)),
        ("sqrt(9/4)", Fraction(3, 2)),
        ("abs(-7) + max(1, 5, 3) - min(4, 2)", Fraction(10)),
        ("round(2.567, 2)", Fraction(257, 100)),
        ("floor(7/2) + ceil(7/2)", Fraction(7)),
    ],
)
def test_exact_values(expression: str, value: Fraction) -> None:
    assert evaluate(expression).number == value


def test_irrational_results_are_floats() -> None:
    assert evaluate("sqrt(2)").number == pytest.approx(1.41421356)
    assert evaluate("2*pi").number == pytest.approx(6.2831853)
    assert evaluate("8**(1/3)").number == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("expression", "text"),
    [
        ("14400*1.2", "17_280"),
        ("2/5", "2/5 = around 0.4"),
        ("2/3", "2/3 = around 0.666667"),
        ("-1/3", "-1/3 = around -0.333333"),
        ("2.7/3", "0.9"),
        ("5.5 * 11", "60.5"),
        ("1000*1000", "1_000_000"),
        ("sqrt(16)", "4"),
    ],
)
def test_output_format(expression: str, text: str) -> None:
    assert calculate(expression) == text


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__('os').system('true')", "only the functions"),
        ("foo + 1", "unknown name 'foo'"),
        ("(1).real", "attribute access"),
        ("().__class__", "attribute access"),
        ("[1, 2][0]", "unsupported syntax"),
        ("'a' * 3", "not a number"),
        ("lambda: 1", "unsupported syntax"),
        ("1 if 1 else 0", "unsupported syntax"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0**-1", "division by zero"),
        ("sqrt(-1)", "negative"),
        ("(-8)**0.5", "negative"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("sqrt", "is a function"),
        ("round(1, x=2)", "keyword"),
        ("1, 2", "several values"),
    ],
)
def test_errors_name_the_problem(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=re.escape(message)):
        calculate(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**9",
        "10**400**2",
        "2**5000",
        "999999**999",
        "(2**1000)**10",
        "1e99999999",
        "2**1000*2**1000*2**1000*2**1000*2**1000",
    ],
)
def test_huge_numbers_are_refused_fast(expression: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match="too large"):
        calculate(expression)
    assert time.perf_counter() - start < 0.5


def test_long_and_deep_input_is_refused() -> None:
    with pytest.raises(CalculatorError, match="too long"):
        calculate("1+" * MAX_LENGTH + "1")
    with pytest.raises(CalculatorError, match="too complex"):
        calculate("+".join(["1"] * 140))  # short enough, but too many parts
    with pytest.raises(CalculatorError):
        calculate("-" * (MAX_LENGTH - 1) + "1")


def test_the_calculator_reproduces_the_calculator_outputs_of_the_data() -> None:
    """Every `<gadget id="calculator">EXPR</gadget><output>VALUE</output>` pair of both splits (the outputs came
    from sympy in Calc-X's builder, not from this calculator)."""
    folder = datasets_root() / "calc_x"
    pairs = []
    for split in ("train", "test"):
        for line in (folder / f"{split}.jsonl").read_text(encoding="utf-8").splitlines():
            pairs += GADGET.findall(json.loads(line)["chain"])
    mismatches = []
    for expression, output in pairs:
        try:
            got = calculate(expression)
        except CalculatorError as exc:
            got = f"error: {exc}"
        if got != output.strip():
            mismatches.append((expression, output, got))
    print(f"{len(pairs)} calculator calls, {len(mismatches)} mismatches:", *mismatches[:20], sep="\n")
    assert len(pairs) > 1000
    assert len(mismatches) <= len(pairs) // 100
