"""The Calc-X answer check against hand-computed cases, answer extraction from model text, and the gold answers
of the real data (each equivalent to itself and to its chain's `<result>`)."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest

from agl_bench.calc_x.evaluate import (
    choices,
    extract_answer,
    is_equivalent,
    option_letter,
    parse_answer,
    read_number,
    score,
)
from agl_bench.datasets import datasets_root


@pytest.mark.parametrize(
    ("prediction", "gold", "same"),
    [
        # relative tolerance 1e-2 of the gold, inclusive
        ("1.009", "1", True),
        ("0.991", "1", True),
        ("1.02", "1", False),
        ("0.98", "1", False),
        ("101", "100", True),
        ("102", "100", False),
        ("-1.005", "-1", True),
        ("1", "-1", False),
        # 0: an absolute tolerance of 1e-6
        ("0", "0", True),
        ("0.0000005", "0", True),
        ("0.001", "0", False),
        # separators, fractions, mixed numbers, decimals, percentages, currency, units
        ("3_828", "3828", True),
        ("3828", "3_828", True),
        ("3,828", "3_828", True),
        ("3,828", "3_829", True),  # within 1%: the rule is numeric
        ("3,828", "3_900", False),
        ("2/3", "0.6667", True),
        ("0.6667", "2/3", True),
        ("0.65", "2/3", False),
        ("2/5 = around 0.4", "2/5", True),
        ("7/36 = around 0.194444", "0.2", False),
        ("1 1/2", "3/2", True),
        ("1 1/2", "1", False),
        ("25%", "25", True),
        ("25%", "0.25", True),
        ("25%", "2.5", False),
        ("$12.50", "12.5", True),
        ("408 eggs", "408", True),
        ("12*34 = 408", "408", True),
        ("0.5", ".5", True),
        # wrong or unreadable
        ("413", "408", False),  # 5 > 4.08
        ("412", "408", True),
        ("five", "5", False),
        ("", "5", False),
        ("Error: division by zero", "0", False),
        # exact match first: even text that reads as no number
        ("  yes ", "yes", True),
    ],
)
def test_is_equivalent(prediction: str, gold: str, same: bool) -> None:
    assert is_equivalent(prediction, gold) is same


@pytest.mark.parametrize(
    ("prediction", "gold", "same"),
    [
        ("C", "C", True),
        ("(C)", "C", True),
        ("C)", "C", True),
        ("c", "C", True),
        ("C) 6 days", "C", True),
        ("Option C", "C", True),
        ("option (c)", "C", True),
        ("The answer is c", "C", True),
        ("The answer is (C).", "C", True),
        ("(B)", "C", False),
        ("Option D", "C", False),
        ("the answer is a number", "A", False),  # the article "a" is not option A
        ("6", "C", False),  # a number matches a letter only through the question's options
    ],
)
def test_option_letters(prediction: str, gold: str, same: bool) -> None:
    assert is_equivalent(prediction, gold) is same


def test_a_number_matches_the_option_it_is_written_in() -> None:
    question = "36 men finish in 18 days. How many days for 108 men?\nChoose one\nA) 24 B) 77 C) 6 D) 29 E) 21"
    assert choices(question) == {"A": "24", "B": "77", "C": "6", "D": "29", "E": "21"}
    assert is_equivalent("6", "C", question)
    assert not is_equivalent("24", "C", question)
    per_line = "Pick one:\nA) 120\nB) 600\nC) 1000"
    assert choices(per_line) == {"A": "120", "B": "600", "C": "1000"}
    assert is_equivalent("600", "B", per_line) and not is_equivalent("1000", "B", per_line)


def test_read_number() -> None:
    assert read_number("-9") == (Fraction(-9), False)
    assert read_number("1,234.5 dollars") == (Fraction(24_69, 2), False)
    assert read_number("12.5%") == (Fraction(1, 8), True)
    assert read_number("1/0") is None
    assert read_number("no digits here") is None
    assert option_letter("42") is None


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Answer: 408", "408"),
        ("12*34 is 408.\nAnswer: 408.", "408"),
        ("**Answer:** 2/3", "2/3"),
        ("```\nAnswer: 5\n```", "5"),
        ("Final answer = 17", "17"),
        ("The answer is (C).", "(C)"),
        ("work...\n<result>2/3 = around 0.666667</result>", "2/3 = around 0.666667"),
        ("so it is \\boxed{12}", "12"),
        ("Answer: 3\nwait, the answer is 4", "4"),  # the last answer line counts
        ("She has 5 apples, then 7 more: 12 apples", "12"),  # lenient fallback: the last number
        ("I do not know.", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_parse_answer_and_score() -> None:
    assert parse_answer("Answer: 3_828") == Fraction(3828)
    assert parse_answer("Answer: (B)") == "B"
    assert parse_answer("Answer: Error: division by zero") is None
    assert parse_answer("no idea") is None
    assert score("Let me compute.\nAnswer: 0.6667", "2/3") == 1.0
    assert score("Answer: 0.6", "2/3") == 0.0
    assert score("no idea", "2/3") == 0.0


def test_every_gold_answer_matches_itself_and_its_chain_result() -> None:
    folder = datasets_root() / "calc_x"
    checked = 0
    for split in ("train", "test"):
        for line in (folder / f"{split}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            (chain_result,) = re.findall(r"<result>(.*?)</result>", row["chain"], re.S)
            assert is_equivalent(row["result"], row["result"]), row["id"]
            assert is_equivalent(chain_result, row["result"]), (row["id"], chain_result, row["result"])
            # a model writing the gold in the prompt's format scores 1
            assert score(f"Answer: {row['result']}", row["result"], row["question"]) == 1.0, row["id"]
            checked += 1
    assert checked == 500
