"""A corpus of hostile completions for the reward fuzz test and bench/rewards_worst.py.

`hostile_completions(canary)` returns (label, completion) pairs; `canary` is the path of a
file that must never appear: every code-injection payload tries to create it. Payloads are
crossed with the places a reward reads an answer from (answer tags, \\boxed{}, math mode,
bare text), so each reaches extraction, the number fast path, and math-verify.
"""

from __future__ import annotations

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
