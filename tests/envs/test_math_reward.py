"""The math reward rule: numeric match with tolerance, answer normalisation, format component."""

from __future__ import annotations

import pytest

from arlctl.envs.math import REWARD_VERSION, extract_answer, parse_number, score
from arlctl.envs.registry import get_reward
from arlctl.errors import TerminalError, UsageError


def task(answer: str) -> dict:
    return {"task_id": "t", "env": "math", "question": "q", "answer": answer}


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("42", "42", 1.0),
        ("7/2", "3.5", 1.0),  # fraction 7/2 = 3.5
        ("3.5", "7/2", 1.0),
        ("\\frac{7}{2}", "3.5", 1.0),
        ("3.5000001", "3.5", 1.0),  # |diff| = 1e-7 <= 1e-6 * 3.5 = 3.5e-6
        ("3.50001", "3.5", 0.0),  # |diff| = 1e-5 > 3.5e-6
        ("1,234", "1234", 1.0),  # thousands separator
        ("1,234,567.5", "1234567.5", 1.0),
        ("1,5", "1.5", 0.0),  # not a thousands separator: "1" then ",5" -> not one number
        ("$12.50", "12.5", 1.0),
        ("12 km", "12", 1.0),  # trailing unit stripped
        ("75%", "75", 1.0),
        ("110 km/h.", "110", 1.0),
        ("x = 5", "5", 1.0),
        ("−5", "-5", 1.0),  # unicode minus
        ("-5", "5", 0.0),
        ("\\$1{,}000", "1000", 1.0),
        ("\\text{ 8 apples}", "8", 1.0),
        ("3 or 4", "3", 0.0),  # two numbers: refuse to guess
        ("about 3", "3", 0.0),
        ("0.0000000001", "0", 1.0),  # |diff| = 1e-10 <= absolute floor 1e-9
        ("0.001", "0", 0.0),
        ("1e3", "1000", 1.0),
        ("1e999999999", "1", 0.0),  # refused, not computed
        ("", "1", 0.0),
    ],
)
def test_correct_component(answer, gold, correct):
    reward, components, info = score(answer, task(gold), "")
    assert components["correct"] == correct, info
    assert reward == correct


def test_format_component_and_weight():
    # Well-formed tag with a wrong number: correct 0, format 1 -> reward 0 + 0.1 * 1 = 0.1
    reward, components, _ = score("41", task("42"), "<answer>41</answer>", format_weight=0.1)
    assert components == {"correct": 0.0, "format": 1.0}
    assert reward == pytest.approx(0.1)
    # Right number: 1 + 0.1 * 1 = 1.1
    assert score("42", task("42"), "", format_weight=0.1)[0] == pytest.approx(1.1)
    # Tag content that is not a number: format 0
    assert score("forty-two", task("42"), "")[1] == {"correct": 0.0, "format": 0.0}


def test_answer_taken_from_response_text_when_no_final_state():
    reward, components, info = score(None, task("15"), "so it is \\boxed{15}. Done")
    assert (reward, components) == (1.0, {"correct": 1.0, "format": 1.0})
    assert info["source"] == "response_text:boxed"
    reward, components, info = score(None, task("15"), "the answer is 15")
    assert (reward, components) == (0.0, {"correct": 0.0, "format": 0.0})
    assert info["source"] == "none" and info["note"] == "no final answer"


def test_info_explains_the_parse():
    _, _, info = score("1,234 dollars", task("1234"), "")
    assert info == {
        "gold": "1234",
        "source": "final_state",
        "answer": "1,234 dollars",
        "note": "parsed; ignored trailing 'dollars'",
        "parsed": "1234",
    }


def test_gsm8k_style_gold_and_bad_gold():
    assert score("72", task("Natalia sold 48/2 = 24 clips in May.\n#### 72"), "")[0] == 1.0
    with pytest.raises(TerminalError, match="not a number"):
        score("1", task("n/a"), "")


def test_extract_answer():
    assert extract_answer("no answer here") is None
    assert extract_answer("<answer> 12 </answer>") == ("12", "answer_tag")
    assert extract_answer("<ANSWER>3</ANSWER> then \\boxed{\\frac{1}{2}}") == ("\\frac{1}{2}", "boxed")
    assert extract_answer("\\boxed{5} then <answer>6</answer>") == ("6", "answer_tag")
    assert extract_answer("\\boxed{5") is None  # unbalanced


def test_parse_number_values():
    from fractions import Fraction

    assert parse_number("7/2")[0] == Fraction(7, 2)
    assert parse_number("-0.25")[0] == Fraction(-1, 4)
    assert parse_number("2.5e-3")[0] == Fraction(1, 400)
    assert parse_number("1/0")[0] is None


def test_registry_versions():
    assert REWARD_VERSION == "math-1"
    assert get_reward("math").version == "math-1"
    weighted = get_reward("math", format_weight=0.1)
    assert weighted.version == "math-1+format_weight=0.1"
    assert weighted.score("1", task("2"), "")[0] == pytest.approx(0.1)


def test_last_number_fallback():
    # SmolLM2-135M's actual reply to "Calculate 11 - 1." had no tag: strict scoring gives 0.
    text = "11 - 1 = 10"
    assert score(None, task("10"), text)[0] == 0.0
    reward, components, info = score(None, task("10"), text, fallback="last_number")
    assert (reward, components) == (1.0, {"correct": 1.0, "format": 0.0})  # right number, no tag
    assert info["source"] == "response_text:last_number" and info["answer"] == "10"
    assert score(None, task("1234.5"), "so 1,000 + 234.5 is 1,234.5.", fallback="last_number")[0] == 1.0
    assert score(None, task("3.5"), "it is 7/2", fallback="last_number")[0] == 1.0
    assert score(None, task("-4"), "x = −4", fallback="last_number")[0] == 1.0
    # A tag, when present, is used even with the fallback on.
    assert score(None, task("5"), "<answer>4</answer> 5", fallback="last_number")[0] == 0.0
    assert score(None, task("5"), "no digits here", fallback="last_number")[1]["correct"] == 0.0
    assert get_reward("math", fallback="last_number").version == "math-1+fallback=last_number"
    with pytest.raises(UsageError):
        score("5", task("5"), "x", fallback="guess")


def test_registry_rejects_unknown_reward_options():
    with pytest.raises(UsageError, match="bad option for reward 'math'"):
        get_reward("math", format_wieght=0.1)
    with pytest.raises(UsageError, match="unknown reward 'chess'"):
        get_reward("chess")
