"""MATH equivalence pinned by a labelled table: tests/data/equivalence_pairs.csv.

Each row is (category, gold, prediction, equivalent 1/0, note) and is one test, asserted
with cold caches, through `is_equivalent` (parse_gold + verify) as rewards and evaluation
use it; a `flexible` row's prediction is a completion, read by the flexible extraction. The rules the labels follow (percent is a unit, a bare list is a set, an inequality
equals its mirror image, ...) are written in grpo_core/verify/answers.py's docstring. Then the
issue's examples one by one, and every MATH-500 gold against itself in several spellings.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from grpo_core.verify import answers as A
from grpo_core.verify import gold as G
from grpo_core.verify.answers import is_equivalent, verify
from grpo_core.verify.gold import parse_gold
from grpo_core.verify.scorer_errors import SCORER_ERRORS

TABLE = Path(__file__).parent / "data" / "equivalence_pairs.csv"
CATEGORIES = {
    "matrix", "vector", "interval", "unbraced", "thousands", "mixed", "percent", "degrees",
    "units", "text", "equation", "inequality", "list", "tuple", "dfrac", "spacing",
    "leftright", "complex", "scientific", "integer", "approx", "variables", "flexible",
}  # fmt: skip
# `flexible` rows hold a whole completion as the prediction: scored by
# is_correct(prediction, gold, extraction="flexible") (its last-resort fallback chain).


def _rows() -> list[dict]:
    with open(TABLE, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


ROWS = _rows()


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    A.warm_up()  # import + first-use costs, paid once outside any test


@pytest.fixture(autouse=True)
def _patient(monkeypatch) -> None:
    """These tests pin verdicts, not speed (tests/test_rewards_fuzz.py bounds the time): on
    a machine busy with other work a 0.6 s deadline can expire and read as "not equal"."""
    monkeypatch.setattr(A, "BUDGET_S", 10.0)
    monkeypatch.setattr(G, "GOLD_DEADLINE_S", 10.0)
    A.clear_caches()


def test_table_covers_every_category_both_ways() -> None:
    assert len(ROWS) >= 200
    assert {r["equivalent"] for r in ROWS} == {"0", "1"}
    for cat in CATEGORIES:
        labels = {r["equivalent"] for r in ROWS if r["category"] == cat}
        assert labels == {"0", "1"}, f"{cat}: needs equivalent and wrong answers, has {labels}"
    assert {r["category"] for r in ROWS} == CATEGORIES
    pairs = [(r["gold"], r["prediction"]) for r in ROWS]
    assert len(set(pairs)) == len(pairs), "duplicate rows"


@pytest.mark.parametrize("row", ROWS, ids=[f"{i:03d}-{r['category']}" for i, r in enumerate(ROWS)])
def test_labelled_pair(row: dict) -> None:
    A.clear_caches()  # each verdict computed, not remembered from another row
    SCORER_ERRORS.reset()
    if row["category"] == "flexible":
        got = A.is_correct(row["prediction"], row["gold"], extraction="flexible")
    else:
        got = is_equivalent(row["gold"], row["prediction"])
    assert got == (row["equivalent"] == "1"), (row["gold"], row["prediction"], row["note"])
    assert SCORER_ERRORS.counts() == {}, "a scorer error is no verdict"


# --- the examples -----------------------------------------------------------------

SPACED = "\\begin{pmatrix} 2 & -3 \\\\ 0 & 3 \\end{pmatrix}"
TIGHT = "\\begin{pmatrix}2&-3\\\\0&3\\end{pmatrix}"


def test_matrix_row_separator_survives_spacing_normalisation() -> None:
    assert A.clean_answer(SPACED).count("\\\\") == 1  # the `\\` stays a row separator
    assert verify(parse_gold(SPACED), TIGHT)
    assert verify(parse_gold(TIGHT), SPACED)
    assert not verify(parse_gold(SPACED), "3")
    assert not verify(parse_gold(TIGHT), "3")


def test_whitespace_between_digits_is_not_cosmetic() -> None:
    assert verify(parse_gold("12"), "1 2") is False
    assert A.canonical("1 2") != A.canonical("12")
    assert A.canonical("x \\leq 5") == A.canonical("x\\leq5")
    assert verify(parse_gold("1000"), "1 000")  # three-digit groups are a separator


def test_unbraced_frac_and_sqrt() -> None:
    gold = parse_gold("\\frac \\pi4 + 2 - \\sqrt2")
    assert gold is not None and gold.number is None
    assert not verify(gold, "2")
    assert verify(gold, "\\frac{\\pi}{4} + 2 - \\sqrt{2}")
    assert A.clean_answer("\\frac \\pi4 + 2 - \\sqrt2") == "\\frac{\\pi}{4} + 2 - \\sqrt{2}"
    assert A.clean_answer("\\dfrac12") == "\\frac{1}{2}"
    assert A.clean_answer("\\sqrt[3]x") == "\\sqrt[3]{x}"


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("11,\\! 111,\\! 100", "11111100"),
        ("11{,}111", "11111"),
        ("\\frac{12}{5,\\!525}", "\\frac{12}{5525}"),
        ("1.5", "1 1/2"),
        ("1.5", "1\\frac{1}{2}"),
        ("\\frac32", "1\\frac{1}{2}"),
    ],
)
def test_thousands_and_mixed_numbers(gold: str, pred: str) -> None:
    assert is_equivalent(gold, pred)
    assert is_equivalent(pred, gold)


def test_strict_convention_decisions() -> None:
    assert is_equivalent("x \\leq 5", "5 \\geq x")  # the same relation
    assert not is_equivalent("10\\%", "0.1")  # percent is a unit
    assert is_equivalent("10\\%", "10")
    assert is_equivalent("10, 4, -2", "4, 10, -2")  # a bare list is a set
    assert not is_equivalent("(10, 4, -2)", "(4, 10, -2)")  # a tuple is ordered


# --- real golds ---------------------------------------------------------------------------


def _spellings(gold: str) -> list[str]:
    """The same answer as a model might write it: wrapped, boxed, spaces removed or added
    around `&` and row separators, `\\dfrac`."""
    return [
        gold,
        f"${gold}$",
        f"\\boxed{{{gold}}}",
        gold.replace(" ", "") if not re.search(r"\d \d", gold) else gold,
        re.sub(r"\s*(&|\\\\)\s*", r" \1 ", gold),
        gold.replace("\\frac", "\\dfrac"),
    ]


def test_math500_golds_verify_against_their_spellings(shared_data: Path) -> None:
    path = shared_data / "math500" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with open(path, encoding="utf-8") as fh:
        golds = [json.loads(line)["answer"] for line in fh if line.strip()]
    SCORER_ERRORS.reset()
    misses = []
    for g in golds:
        parsed = parse_gold(g)
        if parsed is None:
            misses.append((g, None))
            continue
        misses += [(g, s) for s in _spellings(g) if not verify(parsed, s)]
    assert not misses, misses[:20]
    assert SCORER_ERRORS.counts() == {}
