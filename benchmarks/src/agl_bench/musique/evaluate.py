"""Scoring MuSiQue answers as the official evaluation does: SQuAD-style normalisation, exact match and token F1,
each the best over the gold answer and its aliases.

The agent's reply format is one line `Answer: <short answer>`. Parsing is lenient because a small model drifts:
the marker is case-insensitive and may be wrapped in markdown (`**Answer:**`), the last marker wins, and
`<answer>…</answer>` tags (the paper's RAG format) are read too. `parse_answer` returns None when there is no
marked answer, or an empty one (AIR penalises that); when there is no marker at all `extract_answer` falls back
to the last non-empty line, so a correct but unformatted reply still scores.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_TAGGED = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.IGNORECASE | re.DOTALL)
_MARKER = re.compile(r"(?:^|[\s*_#>`\"'(\[])answer\s*[*_]*\s*[:：]\s*[*_]*", re.IGNORECASE)
_WRAPPING = " \t\r\n*_`\"'"


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (SQuAD's normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall over the normalised token multisets."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)  # both empty: 1; one empty: 0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def score(prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """`{"f1", "em"}`: the best of each over the gold answer and its aliases (0 when there are none)."""
    return {
        "f1": max((token_f1(prediction, a) for a in answers), default=0.0),
        "em": max((exact_match(prediction, a) for a in answers), default=0.0),
    }


def _clean(answer: str) -> str:
    line = answer.strip().splitlines()[0] if answer.strip() else ""
    return line.strip(_WRAPPING).rstrip(".").strip(_WRAPPING)


def _marked(text: str) -> str | None:
    """What follows the last answer marker or tag, or None when there is none."""
    tagged = _TAGGED.findall(text)
    if tagged:
        return _clean(tagged[-1])
    markers = list(_MARKER.finditer(text))
    if markers:
        return _clean(text[markers[-1].end() :])
    return None


def parse_answer(text: str) -> str | None:
    """The answer of a reply in the fixed format, or None when the reply has no (non-empty) marked answer."""
    return _marked(text) or None


def extract_answer(text: str) -> str:
    """The answer to score: the marked one (possibly empty), else the last non-empty line (lenient), else ""."""
    marked = _marked(text)
    if marked is not None:
        return marked
    lines = [line for line in text.splitlines() if line.strip()]
    return _clean(lines[-1]) if lines else ""
