"""Is a model's answer to a Calc-X question right? Agent Lightning's Calc-X rule, written with exact fractions.

`is_equivalent(prediction, gold)` tries, in order:
1. the same string after trimming;
2. an option letter: a gold `A`–`E` matches a prediction `C`, `(C)`, `C)`, `C) 6 days`, `Option C`,
   `answer is c`; when the question is given, a prediction that is the number written after the right letter
   (`600` for gold `B` in `... B) 600 ...`) matches too. A gold letter never matches a bare number otherwise;
3. both sides read as numbers (`read_number`) and compared with relative tolerance 1e-2 of the gold
   (`|p − g| ≤ |g|/100`, inclusive, computed exactly); a gold 0 needs `|p| ≤ 1e-6`. A percentage `25%`
   is 1/4 but also matches 25 (questions ask "what percent" and golds hold either form).

`read_number` reads `3_828`, `3,828`, `-9`, `0.5`, `.5`, `2/3`, `1 1/2`, `25%`, `$12.50`, `408 eggs` (the first
number), `12*34 = 408` (after the last `=`), and Calc-X's `2/5 = around 0.4` (the exact part before
`= around`).

`extract_answer(text)` finds the final answer in the model's text: the last `<result>…</result>` (Calc-X's own
markup), else the last line saying `Answer: X` / `answer is X` / `\\boxed{X}`, else (lenient fallback) the
last number in the text; None when there is none. The agent's prompt asks for `Answer: <value>` on the last
line. `parse_answer` is what AIR calls: the answer as a number or option letter, None when unreadable.
"""

from __future__ import annotations

import re
from fractions import Fraction

RELATIVE_TOLERANCE = Fraction(1, 100)
ZERO_TOLERANCE = Fraction(1, 1_000_000)

_INTEGER = r"(?:\d{1,3}(?:,\d{3})+(?![\d])|\d[\d_]*)"
_NUMBER = re.compile(
    rf"""(?P<sign>[-+−]?)\s*\$?\s*
    (?:
        (?P<whole>{_INTEGER})\s+(?P<top>\d+)\s*/\s*(?P<bottom>\d+)(?![\d.])      # mixed: 1 1/2
      | (?P<num>{_INTEGER}(?:\.\d+)?|\.\d+)(?:\s*/\s*(?P<den>{_INTEGER}(?:\.\d+)?))?  # 0.5, 2/3, 3_828
    )
    (?P<percent>\s*%)?""",
    re.VERBOSE,
)
_FENCE = re.compile(r"```[a-zA-Z]*")
_RESULT_TAG = re.compile(r"<result>(.*?)</result>", re.S)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER_LINE = re.compile(r"answer\s*(?:is|:|=|-)\s*:?\s*(.+)", re.I)
_LETTER_ALONE = re.compile(r"\(?([A-Ea-e])\)?[.:]?")
_LETTER_FIRST = re.compile(r"\(?([A-E])\)[\s:.]")
_LETTER_NAMED = re.compile(r"\b(?:option|choice)\s*\(?([A-Ea-e])\b\)?", re.I)
# upper case: a letter anywhere after "answer"; lower case only at the end ("the answer is a number" is not A)
_LETTER_ANSWER = re.compile(r"\b(?i:answer)\s*(?i:is|:)?\s*:?\s*\(?(?:([A-E])\b|([a-e])\)?\s*[.!]?\s*$)")
_CHOICE = re.compile(r"(?:^|\s)([A-E])\)\s*(.*?)(?=\s+[A-E]\)|\n|$)")
_LAST_NUMBER = re.compile(rf"[-−]?(?:{_INTEGER}(?:\.\d+)?|\.\d+)(?:\s*/\s*{_INTEGER})?(?:\s*%)?")


def _clean(text: str) -> str:
    text = _FENCE.sub("", text).replace("**", "").replace("`", "")
    return text.strip().strip("*_").strip()


def _to_fraction(text: str) -> Fraction:
    return Fraction(text.replace(",", "").replace("_", ""))


def read_number(text: str) -> tuple[Fraction, bool] | None:
    """(value, written as a percentage) of the first number in `text`, or None; see the module docstring."""
    text = _clean(text)
    if re.search(r"=\s*(?:around|approx)", text) or "≈" in text:
        text = re.split(r"=\s*(?:around|approx)|≈", text)[0]
    elif "=" in text:
        text = text.rsplit("=", 1)[1]
    match = _NUMBER.search(text)
    if match is None:
        return None
    try:
        if match["whole"] is not None:
            value = _to_fraction(match["whole"]) + Fraction(int(match["top"]), int(match["bottom"]))
        else:
            value = _to_fraction(match["num"])
            if match["den"] is not None:
                value /= _to_fraction(match["den"])
    except ZeroDivisionError:
        return None
    percent = match["percent"] is not None
    if percent:
        value /= 100
    return (-value if match["sign"] in ("-", "−") else value), percent


def option_letter(text: str) -> str | None:
    """The option letter A–E a prediction names (upper case), or None."""
    text = _clean(text)
    alone = _LETTER_ALONE.fullmatch(text)
    if alone:
        return alone.group(1).upper()
    first = _LETTER_FIRST.match(text + " ")
    if first:
        return first.group(1)
    named = _LETTER_NAMED.search(text)
    if named:
        return named.group(1).upper()
    said = _LETTER_ANSWER.search(text)
    if said:
        return (said.group(1) or said.group(2)).upper()
    return None


def choices(question: str) -> dict[str, str]:
    """The options of a multiple-choice question (`A) 24 B) 77 ...` or one per line): letter → text."""
    return {m.group(1): m.group(2).strip() for m in _CHOICE.finditer(question)}


def numbers_close(prediction: Fraction, gold: Fraction) -> bool:
    if gold == 0:
        return abs(prediction) <= ZERO_TOLERANCE
    return abs(prediction - gold) <= RELATIVE_TOLERANCE * abs(gold)


def _candidates(reading: tuple[Fraction, bool]) -> list[Fraction]:
    value, percent = reading
    return [value, value * 100] if percent else [value]


def is_equivalent(prediction: str, gold: str, question: str | None = None) -> bool:
    """Whether `prediction` (an answer value, not the whole model text) matches `gold`."""
    prediction, gold = prediction.strip(), gold.strip()
    if prediction == gold:
        return True
    if _LETTER_ALONE.fullmatch(gold):
        letter = gold.strip("().:").upper()
        named = option_letter(prediction)
        if named is not None:
            return named == letter
        option = choices(question).get(letter) if question else None
        return option is not None and is_equivalent(prediction, option)
    predicted, expected = read_number(prediction), read_number(gold)
    if predicted is None or expected is None:
        return False
    return any(numbers_close(p, g) for p in _candidates(predicted) for g in _candidates(expected))


def extract_answer(text: str) -> str | None:
    """The final answer in a model's text (see the module docstring), or None."""
    if not text:
        return None
    results = _RESULT_TAG.findall(text)
    if results and results[-1].strip():
        return str(results[-1]).strip()
    cleaned = _clean(text)
    boxed = _BOXED.findall(cleaned)
    if boxed and boxed[-1].strip():
        return str(boxed[-1]).strip()
    for line in reversed(cleaned.splitlines()):
        said = _ANSWER_LINE.search(line)
        if said:
            value = said.group(1).strip().rstrip(".").strip()
            if value:
                return value
    numbers = _LAST_NUMBER.findall(cleaned)
    return str(numbers[-1]).strip() if numbers else None


def parse_answer(text: str) -> Fraction | str | None:
    """The model's final answer as a number or an option letter; None when it has none (AIR's parser)."""
    value = extract_answer(text)
    if value is None:
        return None
    reading = read_number(value)
    if reading is not None:
        return reading[0]
    return option_letter(value)


def score(text: str, gold: str, question: str | None = None) -> float:
    """1.0 when the answer in the model's text matches the gold answer, else 0.0."""
    answer = extract_answer(text)
    return 1.0 if answer is not None and is_equivalent(answer, gold, question) else 0.0
