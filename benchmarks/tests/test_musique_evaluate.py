"""MuSiQue scoring: normalisation, EM, token F1 (hand-computed), the max over aliases, and answer parsing."""

from __future__ import annotations

import pytest

from agl_bench.musique.evaluate import exact_match, extract_answer, normalize_answer, parse_answer, score, token_f1


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  Paris,   France. ", "paris france"),
        ("U.S.A.", "usa"),
        ("an apple a day", "apple day"),
        ("Theodore the Great", "theodore great"),  # "the" inside a word stays
        ("", ""),
    ],
)
def test_normalisation(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


def test_exact_match_ignores_case_articles_and_punctuation() -> None:
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "f1"),
    [
        ("Barack Obama", "Obama", 2 / 3),  # P = 1/2, R = 1
        ("red blue green", "red blue yellow", 2 / 3),  # P = R = 2/3
        ("New York", "New York City", 0.8),  # P = 1, R = 2/3 → 2·(2/3)/(5/3)
        ("New York City Hall", "New York City", 6 / 7),  # P = 3/4, R = 1
        ("the cat the cat", "cat", 2 / 3),  # multisets: "cat cat" against "cat": 1 common of 2
        ("Stanley", "stanley!", 1.0),
        ("Berlin", "Paris", 0.0),
        ("", "Paris", 0.0),
    ],
)
def test_token_f1(prediction: str, gold: str, f1: float) -> None:
    assert token_f1(prediction, gold) == pytest.approx(f1)


def test_score_takes_the_best_over_answer_and_aliases() -> None:
    answers = ["United States", "USA", "America"]
    assert score("usa", answers) == {"f1": 1.0, "em": 1.0}
    # against "United States": P = 2/4, R = 1 → 2/3; "America": 1/4, 1 → 0.4; "USA": 0
    assert score("the United States of America", answers) == {"f1": pytest.approx(2 / 3), "em": 0.0}
    assert score("", answers) == {"f1": 0.0, "em": 0.0}
    assert score("anything", []) == {"f1": 0.0, "em": 0.0}


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("Answer: Stanley", "Stanley"),
        ("answer: stanley", "stanley"),
        ("**Answer:** Stanley.", "Stanley"),
        ('I searched twice.\nFinal answer: "Mountrail County"\nThanks', "Mountrail County"),
        ("Answer: Paris\nAnswer: Lyon", "Lyon"),  # the last marker wins
        ("<answer>Mountrail County</answer>", "Mountrail County"),
        ("The answer is in the passages.", None),  # no `answer:` marker
        ("Answer:", None),  # a marker with nothing after it
        ("", None),
    ],
)
def test_parse_answer(reply: str, answer: str | None) -> None:
    assert parse_answer(reply) == answer


def test_extract_answer_falls_back_to_the_last_line() -> None:
    assert extract_answer("Let me think.\nStanley\n\n") == "Stanley"
    assert extract_answer("Answer: Stanley") == "Stanley"
    assert extract_answer("Answer:") == ""  # formatted but empty: nothing to score
    assert extract_answer("   ") == ""
