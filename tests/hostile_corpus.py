"""A corpus of hostile completions for the reward fuzz test and bench/rewards_worst.py.

`hostile_completions(canary)` returns (label, completion) pairs; `canary` is the path of a
file that must never appear: every code-injection payload tries to create it. Payloads are
crossed with the places a reward reads an answer from (answer tags, \\boxed{}, math mode,
bare text), so each reaches extraction, the number fast path, and math-verify.

`fuzz_jobs(canary)` crosses the corpus with every scorer (`scorer_names()`: each reward,
then the evaluation scorer) and `timed_call` runs one job; `init_worker` and `time_chunk`
run them in worker processes.
"""

from __future__ import annotations

import time

MB = 1_000_000


def _injections(canary: str) -> list[str]:
    cmd = f"touch {canary}"
    return [
        f"__import__('os').system('{cmd}')",
        f'__import__("os").system("{cmd}")',
        f"exec(\"import os; os.system('{cmd}')\")",
        f"eval(\"__import__('os').system('{cmd}')\")",
        f"open('{canary}', 'w').write('x')",
        f"(lambda: __import__('os').system('{cmd}'))()",
        f"().__class__.__bases__[0].__subclasses__()[0]('{cmd}')",
        f"__builtins__.__dict__['exec']('open(\"{canary}\",\"w\")')",
        f"1 + __import__('subprocess').call(['touch', '{canary}'])",
        f"sympify(\"__import__('os').system('{cmd}')\")",
        f"Symbol('x'); import os; os.system('{cmd}')",
        f"1; import os; os.system('{cmd}')",
        f"2**2; __import__('pathlib').Path('{canary}').touch()",
        f"getattr(__import__('os'), 'system')('{cmd}')",
        "\\input{/etc/passwd}",
        f"\\include{{{canary}}}",
        f"\\write18{{{cmd}}}",
        f"\\immediate\\write18{{{cmd}}}",
        f"\\def\\x{{\\write18{{{cmd}}}}}\\x",
        f"\\csname write18\\endcsname{{{cmd}}}",
        f"\\text{{__import__('os').system('{cmd}')}}",
        f"\\operatorname{{__import__}}('os').system('{cmd}')",
        f"\\mathrm{{eval}}(\\text{{{cmd}}})",
        f"{{{{7*7}}}} {{% import os %}}{{{{os.system('{cmd}')}}}}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"x = 5; __import__('os').system('{cmd}')",
        f"The final answer is __import__('os').system('{cmd}'). I hope it is correct.",
        f"final answer is: 1+__import__('os').system('{cmd}')",
        f"Answer: $\\boxed{{__import__('os').system('{cmd}')}}$",
        "Lambda(x, x)(__import__('os'))",
        "Function('system')(1)",
        "Integer(9)**Integer(9)**Integer(9)**Integer(9)",
        "N(pi, 10**9)",
        "Matrix.eye(10**5)",
    ]


def _math_bombs() -> list[str]:
    return [
        "9^9^9^9^9",
        "9^{9^{9^{9}}}",
        "10^{10^{10}}",
        "2^{2^{2^{2^{2^{2}}}}}",
        "9^{99}^{99}^{99}",
        "(9^{9999})^{9999}",
        "((9^{99})^{99})^{99}",
        "{9^{9}}^{9^{9}}",
        "2^{100000000}",
        "10^{999999999}",
        "9**9**9**9",
        "10**10**10",
        "(10**100)**(10**100)",
        "(10^{100})!",
        "100000!",
        "3!!!!!!!",
        "(3!)!!!",
        "9999999999!",
        "\\binom{10^{50}}{10^{25}}",
        "\\binom{99999999}{49999999}",
        "\\sum_{k=1}^{10^{9}} k!",
        "\\sum_{k=1}^{999999} k^{k}",
        "\\prod_{k=1}^{9999} k^{k}",
        "\\int_0^1 e^{x^2}\\sin(x^{x})\\,dx",
        "\\int \\frac{\\sin(x^{5})}{\\log(x^{3}+1)}\\,dx",
        "\\lim_{x\\to 0} \\frac{\\sin(x^{x})}{x}",
        "\\frac{1}{0}",
        "0^0",
        "\\infty - \\infty",
        "(x+1)^{9999}",
        "x^{99999}",
        "e^{e^{e^{e^{e^{e^{10}}}}}}",
        "\\sqrt[10^{9}]{2}",
        "\\underbrace{9^9}_{9^9}",
        "1e999999999",
        "9" * 5000,
        "9" * 100_000,
        "1," * 50_000 + "1",
        "0." + "3" * 100_000,
        "-" * 10_000 + "1",
        "1/" + "0" * 1000,
        "\\frac{" + "9" * 1000 + "}{" + "7" * 1000 + "}",
        "50" + "\\%" * 10_000,
        "\\$" * 10_000 + "5",
        "1 " * 200_000,
        "x=" * 10_000 + "1",
        "\\left(" * 5000 + "1" + "\\right)" * 5000,
        "\\begin{pmatrix}" + " & ".join(["1"] * 5000) + "\\end{pmatrix}",
        "\\{" + ",".join(str(i) for i in range(20_000)) + "\\}",
    ]


def _nesting() -> list[str]:
    n = 10_000
    return [
        "\\boxed{" * n,
        "\\boxed{" * n + "1" + "}" * n,
        "\\boxed{" * n + "1" + "}" * (n // 2),
        "{" * n,
        "}" * n + "\\boxed{1",
        "{" * n + "1" + "}" * n,
        "(" * n + "1" + ")" * n,
        "[" * n,
        "\\frac{" * 5000 + "1" + "}{2}" * 5000,
        "\\sqrt{" * n + "2" + "}" * n,
        "\\fbox{" * n + "1" + "}" * n,
        "x^{" * n + "2" + "}" * n,
        "\\boxed{\\boxed{\\boxed{5}}",
        "\\boxed{}" * n,
        "\\boxed" * n,
        "\\boxed{1}}}}}}}}}}",
        "\\boxed{{{{{{{{{{1}",
        "$" * n,
        "\\[" * n,
        "\\(" * n + "1",
    ]


def _text_bombs() -> list[str]:
    return [
        "a" * MB,
        "9" * MB,
        "{" * MB,
        "\\" * MB,
        "so " * (MB // 3),
        "therefore thus hence because so 因此 所以 " * 20_000,
        "ab " * (MB // 3),
        "<answer>" * (MB // 8),
        "</answer>" * (MB // 9),
        "<think>" * (MB // 7),
        "<answer>5</answer>" * 50_000,
        "final answer is " * 50_000,
        "answer: " * 100_000 + "5",
        "<answer>" + "1 " * (MB // 2) + "</answer>",  # a megabyte answer, mostly spaces
        "\u00e9" * MB,
        "\U0001f600" * (MB // 4),
        "\u202e" * 1000 + "5",
    ]


def _unicode() -> list[str]:
    return [
        "\x00",
        "5\x00",
        "\x00" * 1000 + "5",
        "\u202e5\u202c",  # RTL override
        "\u200f42\u200e",  # RTL/LTR marks
        "4\u200b2",  # zero-width space
        "\u200d\u200c\ufeff5",  # ZWJ, ZWNJ, BOM
        "\ufeff\\frac{1}{2}",
        "５",  # fullwidth
        "١٢٣",  # Arabic-Indic digits
        "²³",
        "Ⅻ",
        "5\u0301\u0301\u0301",  # combining accents
        "\ud800",  # lone surrogate
        "\udfff\\boxed{1}",
        "\U0010ffff",
        "\r\n5\r\n",
        "\t\x0b\x0c5",
        "\x1b[31m5\x1b[0m",
        "５０％",
    ]


def _tag_games() -> list[str]:
    return [
        "<answer>",
        "</answer>",
        "</answer><answer>",
        "<answer><answer>5</answer></answer>",
        "<answer>5</answer><answer>",
        "<answer></answer>",
        "<answer>   </answer>",
        "<think></think><answer></answer>",
        "<think><think>x</think></think><answer>5</answer>",
        "<think>x</think><answer>5</answer><think>y</think>",
        "<think>x<answer>5</answer></think>",
        "<answer>5</answer><think>x</think>",
        "</think><answer>5</answer>",
        "<think>x</think>\n\n<answer>\n5\n</answer>\n\n",
        "<ANSWER>5</ANSWER>",
        "<answer >5</answer >",
        "&lt;answer&gt;5&lt;/answer&gt;",
        "<ans<answer>wer>5</ans</answer>wer>",
        "<answer>\\boxed{</answer>}",
        "\\boxed{<answer>5</answer>}",
        "<think>" + "<answer>" * 1000 + "</think>",
        "<answer>" + "<think>" * 1000 + "5</answer>",
        "<answer>5",
        "5</answer>",
        "<think>" * 3 + "</think>" * 3 + "<answer>5</answer>" * 3,
    ]


def _wrap(payload: str) -> list[tuple[str, str]]:
    return [
        ("tags", f"<think>reasoning</think>\n<answer>{payload}</answer>"),
        ("boxed", f"so the answer is \\boxed{{{payload}}}"),
        ("math", f"<answer>${payload}$</answer>"),
    ]


def hostile_completions(canary: str) -> list[tuple[str, str]]:
    """(label, completion) pairs: >= 200 hostile completions."""
    out: list[tuple[str, str]] = []
    for i, p in enumerate(_injections(canary)):
        out += [(f"inject{i}/{w}", c) for w, c in _wrap(p)] + [(f"inject{i}/bare", p)]
    for group, payloads in (("bomb", _math_bombs()), ("nest", _nesting()), ("unicode", _unicode())):
        for i, p in enumerate(payloads):
            out += [(f"{group}{i}/{w}", c) for w, c in _wrap(p)] + [(f"{group}{i}/bare", p)]
    out += [(f"text{i}", p) for i, p in enumerate(_text_bombs())]
    out += [(f"tags{i}", p) for i, p in enumerate(_tag_games())]
    return out


def odd_completions() -> list:
    """Completions of the wrong shape, as a buggy caller or dataset might pass them."""
    return [
        None,
        5,
        3.5,
        b"<answer>5</answer>",
        {"content": "<answer>5</answer>"},
        [],
        [{}],
        [{"role": "assistant"}],
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "content": 5}],
        [{"role": "assistant", "content": ["x", 5]}],
        [{"role": "assistant", "content": [{"type": "text", "text": "<answer>5</answer>"}]}],
        ["<answer>5</answer>"],
        [None],
        object(),
    ]


# --- scoring: what the fuzz test and the bench run each completion through ------------

GOLDS = ["5", "\\frac{1}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)"]
EVAL_SCORER = "evaluation"  # the eval path's scoring of one sampled completion


def scorer_names() -> list[str]:
    """Every reward of grpo_core.verify.rewards.REWARDS, then the evaluation scorer."""
    from grpo_core.verify.rewards import REWARDS

    return [*REWARDS, EVAL_SCORER]


def _score_for_eval(completion: str, gold: str) -> None:
    """Score one completion as grpo_core.eval.evaluation does a sample: `_record` (extraction,
    verification against the gold, format flag) then the per-problem metrics, whose maj@k
    canonicalises the extracted answer with `vote_key`."""
    from grpo_core.data.problems import Problem
    from grpo_core.eval.evaluation import _record, vote_key
    from grpo_core.eval.metrics import problem_scores
    from grpo_core.generation.rollout import Completion

    problem = Problem(source="fuzz", split="test", problem="Question: ...", answer=gold)
    sample = Completion(text=completion, num_tokens=len(completion) // 4, finish_reason="stop")
    rec = _record(problem, None, [sample], think=True)
    assert isinstance(rec["sample_correct"][0], bool)
    assert rec["sample_answers"][0] is None or isinstance(rec["sample_answers"][0], str)
    assert isinstance(rec["sample_well_formatted"][0], bool)
    scores = problem_scores(rec, [1], canon=vote_key)
    assert set(scores) == {"avg@1", "pass@1", "maj@1"}, scores


def timed_call(name: str, completion, gold: str) -> float:
    """Run scorer `name` on one completion; the seconds it took. Raises on a wrong result."""
    from grpo_core.verify.rewards import REWARDS

    start = time.perf_counter()
    if name == EVAL_SCORER:
        _score_for_eval(completion, gold)
    else:
        out = REWARDS[name]([completion], answer=[gold], prompts=["Question: ... <think>"])
        assert isinstance(out, list) and len(out) == 1, (name, out)
        assert out[0] is None or isinstance(out[0], float), (name, out)
    return time.perf_counter() - start


def fuzz_jobs(canary: str) -> list[tuple[str, str, str, str]]:
    """(scorer, label, completion, gold) for every scorer x hostile completion."""
    corpus = hostile_completions(canary)
    return [
        (n, label, c, GOLDS[i % len(GOLDS)])
        for n in scorer_names()
        for i, (label, c) in enumerate(corpus)
    ]


# Process workers: each rebuilds the jobs from the canary path (cheap) rather than have
# megabyte strings pickled to it, and is sent only (chunk, number of chunks).
_WORKER_JOBS: dict[str, list] = {}


def init_worker() -> None:
    """ProcessPoolExecutor initializer: pay imports and math-verify's first-use costs outside
    any timing, and forget verdicts a forked worker inherited: each one is recomputed here."""
    import grpo_core.eval.evaluation
    import grpo_core.eval.metrics
    import grpo_core.verify.rewards  # noqa: F401 - imported for their import cost
    from grpo_core.verify import answers

    answers.warm_up()
    timed_call(EVAL_SCORER, "<answer>5</answer>", GOLDS[0])  # the eval path's first use
    answers.clear_caches()


def time_chunk(canary: str, chunk: int, chunks: int) -> list[tuple[int, float]]:
    """In a worker process: (job index, seconds) for jobs chunk, chunk + chunks, ..."""
    if canary not in _WORKER_JOBS:
        _WORKER_JOBS[canary] = fuzz_jobs(canary)
    jobs = _WORKER_JOBS[canary]
    return [(i, timed_call(jobs[i][0], jobs[i][2], jobs[i][3]))
            for i in range(chunk, len(jobs), chunks)]
