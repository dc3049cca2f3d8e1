"""The scorer's fast paths (grpo_core/verify/answers.py): each decides a verdict without
math-verify's parser, and agrees with math-verify itself. How fast they are is
bd2f15f:bench/scoring_paths.py's to say (a one-off, removed); these tests pin that the path is taken and the verdict.

- a right answer in the gold's own spelling: no parse of gold or prediction (the gold is
  read lazily, parse_gold(lazy=True), by the first prediction that needs it);
- code, not math (`__import__('os').system(...)`): refused before any parse
  (math_verify_adapter.never_read);
- a wrong answer of another shape (a matrix or a union against a number, a word against a
  number, an equation's right-hand side, polynomials in other variables, `2 + 7i`):
  disproved by quick_value's cheap reading.
"""

from __future__ import annotations

import json
import random

import pytest
from hostile_corpus import hostile_completions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_core.verify import answers as A
from grpo_core.verify import gold as G
from grpo_core.verify.math_verify_adapter import math_verify_fns, mv_parse, never_read
from grpo_core.verify.quick_value import quick_profile, quick_unequal
from grpo_core.verify.rewards import accuracy
from grpo_core.verify.safe_eval import TIMED_OUT, call_with_deadline


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    A.warm_up()


@pytest.fixture
def parser_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every math-verify parse the scorer asks for (recorded, then done)."""
    calls: list[str] = []
    for module in (A, G):  # golds are parsed in gold, predictions in answers
        monkeypatch.setattr(module, "mv_parse", lambda text: calls.append(text) or mv_parse(text))
    monkeypatch.setattr(A, "BUDGET_S", 10.0)  # verdicts, not speed: a busy machine is fine
    A.clear_caches()
    A.SCORER_ERRORS.reset()
    yield calls
    assert A.SCORER_ERRORS.counts() == {}
    A.clear_caches()


def _math_verify_says(gold: str, pred: str) -> bool:
    """math-verify alone on the two cleaned answers, none of our fast paths."""
    _, verify = math_verify_fns()
    g, p = mv_parse(G.for_mv(A.clean_answer(gold))), mv_parse(G.for_mv(A.clean_answer(pred)))
    return bool(g) and bool(p) and verify(g, p, timeout_seconds=None)


# --- right answers ------------------------------------------------------------------------

GOLDS = [
    "\\begin{pmatrix} 31 & 50 \\\\ -18 & -29 \\end{pmatrix}",
    "(-\\infty, -7)\\cup(-7, 3)\\cup(3, \\infty)",
    "\\text{(C)}",
    "\\frac{\\sqrt{3}}{2}",
    "x \\in [-2,7]",
    "\\{1\\pm\\sqrt{5},-2\\}",
    "2x^9 - 8x^7 + 9x^6",
    "y = -\\frac{1}{2} x^2 + 4x - 6",
    "\\sec x",
    "204_5",
]


@pytest.mark.parametrize("gold", GOLDS)
def test_right_answer_in_the_golds_spelling_needs_no_parse(parser_calls, gold: str) -> None:
    assert A.is_correct(f"So the answer is $\\boxed{{{gold}}}$.", gold)
    assert accuracy([f"<answer>{gold}</answer>"], answer=[gold]) == [1.0]
    spaced = gold.replace("(", "\\left(").replace(")", "\\right)") if "(" in gold else f" {gold} "
    assert A.is_equivalent(gold, spaced)  # one canonical spelling
    assert parser_calls == []


def test_other_spellings_still_go_to_math_verify(parser_calls) -> None:
    assert A.is_equivalent("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}")
    assert A.is_equivalent("\\sec x", "\\frac{1}{\\cos x}")
    assert "\\sec x" in parser_calls  # the lazy gold, read when first needed


def test_eager_and_lazy_golds() -> None:
    """Ingest asks parse_gold (eager) whether a gold reads: it still does. A lazy gold that
    math-verify turns out to read nothing in is not scored (None), and is remembered."""
    A.clear_caches()
    unreadable = "$(touch x)"  # math-verify's parse of it is empty
    assert G.parse_gold(unreadable) is None
    A.clear_caches()
    assert G.parse_gold(unreadable, lazy=True) is not None
    assert accuracy(["<answer>5</answer>"], answer=[unreadable]) == [None]
    assert G.parse_gold(unreadable, lazy=True) is None
    assert G.parse_gold("\\sec x") is not None and G.parse_gold("\\sec x").parsed
    assert A.grade(G.parse_gold("9", lazy=True), "9.0") is True
    A.clear_caches()


# --- code, not math ---------------------------------------------------------------------

ISSUE_EXAMPLE = "<answer>__import__('os').system('touch x')</answer>"


def test_code_is_refused_before_any_parse(parser_calls, tmp_path) -> None:
    canary = tmp_path / "CANARY"  # a path with digits, as pytest makes them
    assert accuracy([ISSUE_EXAMPLE] * 3, answer=["7", "\\frac{1}{2}", "x+1"]) == [0.0] * 3
    refused = [c for label, c in hostile_completions(str(canary))
               if label.startswith("inject") and never_read(A.extract_answer(c) or "", "7")]
    assert len(refused) >= 20
    assert not any(A.is_correct(c, "7", extraction=m) for c in refused for m in A.EXTRACTIONS)
    assert parser_calls == []
    assert not canary.exists()


def test_code_with_a_number_math_verify_reads_is_left_to_it(parser_calls) -> None:
    # math-verify reads 5 out of `x = 5; ...` (its verdict, unchanged): no fast path here
    assert A.is_correct("<answer>x = 5; __import__('os').system('touch x')</answer>", "5")
    assert parser_calls


# Characters of code and shell, and of text math-verify reads apart (digits, `$`, `[`, `=`);
# the second alphabet lacks those, so that most of its texts are ones never_read refuses.
CODE = list("abcdefxyzEiOS_()'\". /-;=+*,:{}`@#?!^&|~<>$[]0123456789") + ["__", "import", " 7"]
CODE_ONLY = list("abcdefxyzEiOS_()'\". /-;+*,:`@#?!^&|~<>") + ["__", "import", "os", "x0"]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(*(st.lists(st.sampled_from(a), min_size=1, max_size=30).map("".join)
                   for a in (CODE, CODE_ONLY))))
def test_never_read_is_what_math_verify_reads(text: str) -> None:
    """Whenever never_read says math-verify reads no value in a text, its parse is only
    fallback strings, each with a mark no gold without one can equal."""
    if never_read(text, "7"):
        parsed = call_with_deadline(mv_parse, text, seconds=5.0)
        assert parsed is not TIMED_OUT, text
        assert all(isinstance(p, str) and ("__" in p or any(c in p for c in "`@#?"))
                   for p in parsed), (text, parsed)


def test_never_read_on_the_hostile_corpus(tmp_path) -> None:
    for _, completion in hostile_completions(str(tmp_path / "CANARY")):
        answer = A.extract_answer(completion) or ""
        if len(answer) < 300 and never_read(answer, "7"):
            parsed = mv_parse(answer)
            assert all(isinstance(p, str) for p in parsed), (answer, parsed)


# --- wrong answers of another shape -------------------------------------------------------

DISPROVED = [
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "29"),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\text{odd}"),
    ("(-\\infty,-2] \\cup [-1,\\infty)", "\\frac{2}{9}"),
    ("(0,1)\\cup(2,3)", "x"),
    ("\\text{Friday}", "43"),
    ("\\text{(B)}", "0"),
    ("5x - 7y + 11z + 4 = 0", "7"),
    ("y = \\frac{1}{2} x + 2", "6"),
    ("x=-10", "-6"),
    ("-2-14i", "30"),
    ("2i", "15"),
    ("x+6", "\\frac{2x-7}{(x+1)(x-2)}"),
    ("-8 x^4+7x^2-7x+8", "9z(z^2 - 3z + 3)"),
    ("2x+1", "2y+1"),
]
NOT_DISPROVED = [  # equal under math-verify: the cheap reading must leave them to it
    ("x", "X"),
    ("2x+1", "2X+1"),
    ("x=5", "5"),
    ("y=2x+1", "2x+1"),
    ("1", "\\frac{x^2}{16} - \\frac{y^2}{9} = 1"),  # the equation answering: its rhs
    ("\\text{(A)}", "a"),
    ("\\text{odd}", "odd"),
    ("x+1", "1+x"),
    ("2+7i", "7i+2"),
]


@pytest.mark.parametrize(("gold", "pred"), DISPROVED)
def test_other_shapes_are_disproved_without_a_parse(parser_calls, gold: str, pred: str) -> None:
    assert not A.is_equivalent(gold, pred)
    assert parser_calls == []
    assert not _math_verify_says(gold, pred)  # math-verify agrees


@pytest.mark.parametrize(("gold", "pred"), NOT_DISPROVED)
def test_equal_shapes_are_left_to_math_verify(parser_calls, gold: str, pred: str) -> None:
    g, p = (quick_profile(A.clean_answer(t)) for t in (gold, pred))
    assert not quick_unequal(g, p) and not quick_unequal(p, g)
    assert A.is_equivalent(gold, pred) and _math_verify_says(gold, pred)


def test_cheap_disproofs_agree_with_math_verify_on_math_golds(shared_data) -> None:
    """A sample of MATH answer pairs the cheap reading disproves: math-verify says unequal
    on every one (bd2f15f:bench/scoring_paths.py measured what the reading spares)."""
    path = shared_data / "math500" / "test.jsonl"
    golds = sorted({A.clean_answer(json.loads(line)["answer"])
                    for line in path.read_text(encoding="utf-8").splitlines() if line})
    rng = random.Random(0)
    fired: dict[tuple, list] = {}
    for g in golds:
        for p in rng.sample(golds, 20):
            if g == p or (A.as_number(g) and A.as_number(p)):
                continue
            qg, qp = quick_profile(g), quick_profile(p)
            if qg and qp and quick_unequal(qg, qp):
                fired.setdefault((qg[0], qp[0]), []).append((g, p))
    sample = [pair for pairs in fired.values() for pair in pairs[:4]]
    assert len(fired) >= 6 and len(sample) >= 20, fired.keys()
    assert not [pair for pair in sample if _math_verify_says(*pair)]
