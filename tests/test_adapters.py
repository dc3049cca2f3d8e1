"""Dataset adapters: presets (local and hub), generic files, column mappings, errors."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

import grpo_core.verify.answers  # noqa: F401 - the adapters extract golds: must import, not skip
from grpo_core.data.adapters import PRESETS, resolve_source
from grpo_core.data.problems import Problem
from grpo_core.data.readers import BadRow, Rejection, SourceUnreadable
from grpo_core.data.source import SourceError, parse_columns

ROWS = [{"q": "What is 6*7?", "a": "42", "why": "6*7=42", "lvl": "Level 2", "topic": "arith"},
        {"q": "Half of one?", "a": "\\frac{1}{2}", "why": "", "lvl": 1, "topic": "fractions"}]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _problems(adapter):
    out = [adapter.convert(i, raw) for i, raw in adapter.rows()]
    return out


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name,split,rows", [
    ("gsm8k", "train", 7473), ("gsm8k", "test", 1319), ("math", "train", 4500),
    ("math500", "test", 500), ("aime24", "test", 30), ("aime25", "test", 30),
    ("amc23", "test", 40)])
def test_presets_read_local_copies(shared_data, name, split, rows):
    adapter = resolve_source(name, split=split, data_dir=shared_data)
    assert (adapter.source, adapter.split) == (name, split)
    raw = list(adapter.rows())
    assert len(raw) == rows
    first = adapter.convert(*raw[0])
    assert isinstance(first, Problem), first
    assert first.problem and first.answer and first.id.startswith(f"{name}/{split}/")


def test_preset_conversions(shared_data):
    gsm = _problems(resolve_source("gsm8k", data_dir=shared_data, limit=2))
    assert [p.answer for p in gsm] == ["72", "10"]
    assert "####" in gsm[0].solution and gsm[0].problem.startswith("Natalia sold clips")
    math = _problems(resolve_source("math", data_dir=shared_data, limit=1))[0]
    assert (math.answer, math.level, math.subject, math.id) == ("2", 3, "Algebra", "math/train/0")
    m500 = _problems(resolve_source("math500", data_dir=shared_data, limit=1))[0]
    assert m500.id == "math500/test/test/precalculus/807.json" and m500.level == 2
    amc = _problems(resolve_source("amc23", data_dir=shared_data, limit=1))[0]
    assert amc.answer == "27"  # 27.0 in the file
    aime = _problems(resolve_source("aime24", data_dir=shared_data))
    assert all(isinstance(p, Problem) for p in aime) and aime[0].answer == "204"


def test_data_dir_from_environment(shared_data, monkeypatch):
    monkeypatch.setenv("GRPO_DATA_DIR", str(shared_data))
    assert resolve_source("aime25").origin == str(shared_data / "aime25" / "test.jsonl")


def test_shared_file_path_is_recognised_as_its_preset(shared_data):
    adapter = resolve_source(str(shared_data / "gsm8k" / "test.jsonl"), limit=1)
    assert (adapter.source, adapter.split, adapter.gold) == ("gsm8k", "test", "gsm8k")
    assert _problems(adapter)[0].answer == "18"


def test_preset_errors_are_one_line(tmp_path):
    for source, kw, words in [
        ("gsm9k", {}, "unknown source 'gsm9k'"),
        ("gsm8k", {"split": "validation", "data_dir": tmp_path}, "no split 'validation'"),
        ("aime24", {"data_dir": tmp_path}, "not found"),
    ]:
        with pytest.raises(SourceError) as err:
            resolve_source(source, **kw)
        assert words in str(err.value) and "\n" not in str(err.value)


def _fake_hub(monkeypatch, rows_for):
    """The hub as the network would serve it, replaced (no network here): a builder whose
    stream is an in-memory dataset's. `rows_for(path, name, split)` gives the rows (or
    raises, as an unreachable hub does). Calls are recorded in the returned list."""
    datasets = pytest.importorskip("datasets")
    from types import SimpleNamespace

    calls = []

    def builder(path, name=None):
        def stream(split):
            calls.append((path, name, split))
            return datasets.Dataset.from_list(rows_for(path, name, split)).to_iterable_dataset()
        return SimpleNamespace(hash=f"rev-{path}-{name}", as_streaming_dataset=stream)

    monkeypatch.delenv("GRPO_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset_builder", builder)
    return calls


def test_hub_presets_are_streamed_from_the_hub(shared_data, monkeypatch):
    calls = _fake_hub(monkeypatch, lambda *a: [
        json.loads(x) for x in (shared_data / "aime24/test.jsonl").open()][:3])
    adapter = resolve_source("aime24")
    assert calls == [("HuggingFaceH4/aime_2024", None, "train")]  # the hub's only split
    assert (adapter.source, adapter.split) == ("aime24", "test")
    assert [p.answer for p in _problems(adapter)] == ["204", "113", "371"]
    resolve_source("gsm8k", split="test", limit=1)
    assert calls[-1] == ("openai/gsm8k", "main", "test")
    other = resolve_source("someone/aime-copy", columns="problem=problem,answer=answer")
    assert calls[-1] == ("someone/aime-copy", None, "train") and other.source == "someone/aime-copy"
    assert {p.source for p in _problems(other)} == {"someone/aime-copy"}
    assert set(PRESETS) == {"gsm8k", "math", "math500", "aime24", "aime25", "amc23"}


def test_hub_math_with_or_without_an_answer_column(monkeypatch):
    rows = [{"problem": "P?", "solution": "so $\\boxed{7}$", "answer": None, "level": "Level 2",
             "type": "Algebra"},
            {"problem": "Q?", "solution": "long", "answer": "\\frac{1}{3}", "level": "Level ?",
             "type": "Geometry"}]
    _fake_hub(monkeypatch, lambda *a: rows)
    p, q = _problems(resolve_source("math", split="test"))
    assert (p.answer, p.level, p.subject, p.split) == ("7", 2, "Algebra", "test")
    assert (q.answer, q.level, q.subject) == ("\\frac{1}{3}", None, "Geometry")


def test_unreachable_hub_id_is_a_source_error(monkeypatch):
    def offline(*a):
        raise ConnectionError("Couldn't reach the Hugging Face Hub\nmore lines")

    _fake_hub(monkeypatch, offline)
    with pytest.raises(SourceError, match=r"cannot load hub dataset owner/name \(train\): "
                                          r"Couldn't reach the Hugging Face Hub$"):
        resolve_source("owner/name")


# --------------------------------------------------------------------------- files


def test_jsonl_with_mapping(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    adapter = resolve_source(str(path),
                             columns="problem=q,answer=a,solution=why,level=lvl,subject=topic")
    assert (adapter.source, adapter.split) == ("mine", "train")
    p1, p2 = _problems(adapter)
    assert (p1.problem, p1.answer, p1.solution, p1.level, p1.subject) == (
        "What is 6*7?", "42", "6*7=42", 2, "arith")
    assert (p2.answer, p2.level, p2.id) == ("\\frac{1}{2}", 1, "mine/train/1")


@pytest.mark.parametrize("fmt", ["json-list", "json-wrapped", "json-columnar", "csv", "parquet"])
def test_other_formats(tmp_path, fmt):
    if fmt == "csv":
        path = tmp_path / "set.csv"
        path.write_text("question,answer\nWhat is 024 + 1?,025\n\"Two, lines\nhere?\",3\n")
    elif fmt == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        path = tmp_path / "set.parquet"
        pq.write_table(pa.Table.from_pylist([{"question": "What is 024 + 1?", "answer": "025"},
                                             {"question": "x", "answer": "3"}]), path)
    else:
        rows = [{"question": "What is 024 + 1?", "answer": "025"},
                {"question": "Two, lines\nhere?", "answer": 3}]
        doc = {"json-list": rows, "json-wrapped": {"version": 1, "data": rows},
               "json-columnar": {"question": [r["question"] for r in rows],
                                 "answer": [r["answer"] for r in rows]}}[fmt]
        path = tmp_path / "set.json"
        path.write_text(json.dumps(doc))
    probs = _problems(resolve_source(str(path)))
    assert len(probs) == 2 and all(isinstance(p, Problem) for p in probs)
    assert probs[0].problem == "What is 024 + 1?"
    assert probs[0].answer in ("025", "25")  # csv/parquet keep strings: never 25 by inference
    assert probs[1].answer == "3"


def test_auto_gold_rules(tmp_path):
    path = _write_jsonl(tmp_path / "mixed.jsonl", [
        {"question": "A?", "answer": "Work: 2+2=4\n#### 1,234"},
        {"problem": "B?", "solution": "so it is $\\boxed{\\frac{3}{4}}$."}])
    a, b = _problems(resolve_source(str(path)))
    assert a.answer == "1234" and b.answer == "\\frac{3}{4}"


def test_mapping_to_missing_column_is_refused(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    with pytest.raises(SourceError) as err:
        resolve_source(str(path), columns="problem=question,answer=a")
    msg = str(err.value)
    assert str(path) in msg and "'question'" in msg and "columns: a, lvl, q, topic, why" in msg
    with pytest.raises(SourceError, match="no problem column"):
        resolve_source(str(path))
    with pytest.raises(SourceError, match="unknown field 'prompt'"):
        parse_columns("prompt=q")
    with pytest.raises(SourceError, match="must look like"):
        parse_columns("problem")


def test_missing_and_unsupported_paths(tmp_path):
    for source, words in [(str(tmp_path / "nope.jsonl"), "no such file"),
                          ("./missing/file.csv", "no such file"),
                          (str(tmp_path), "is a directory")]:
        with pytest.raises(SourceError, match=words):
            resolve_source(source)
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(SourceError, match="unsupported format '.txt'"):
        resolve_source(str(tmp_path / "x.txt"))


def test_bad_lines_become_bad_rows(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"problem": "ok?", "answer": "1"}\n'
                     b'{"problem": "broken", "answer": \n'
                     b'\n'
                     b'{"problem": "caf\xe9 latin-1?", "answer": "2"}\n'
                     b'[1, 2]\r\n'
                     b'{"problem": "raw \xe2\x80\xa8 separator \xc2\x85 inside", "answer": "3"}\n')
    adapter = resolve_source(str(path))
    rows = list(adapter.rows())
    assert [i for i, _ in rows] == [0, 1, 2, 3, 4]  # blank lines are not rows
    assert rows[4][1]["problem"] == "raw \u2028 separator \x85 inside"  # one line, not three
    assert isinstance(rows[1][1], BadRow) and rows[1][1].rejection.code == "malformed_json"
    assert "line 2" in rows[1][1].rejection.detail
    assert "\udce9" in rows[2][1]["problem"]  # kept for the store to quarantine as undecodable
    assert adapter.convert(*rows[3]) == Rejection("wrong_type", "row is list, not an object")


def test_wrong_types_and_missing_fields_are_rejected(tmp_path):
    path = _write_jsonl(tmp_path / "types.jsonl", [
        {"problem": ["a list"], "answer": "1"}, {"problem": "  ", "answer": "1"},
        {"problem": "no answer?"}, {"problem": "bool?", "answer": True},
        {"problem": "level?", "answer": "1", "level": {"x": 1}}, {"answer": "1"}])
    codes = [r.code for r in _problems(resolve_source(str(path)))]
    assert codes == ["wrong_type", "empty_problem", "missing_answer", "wrong_type", "wrong_type",
                     "missing_problem"]


def test_corrupt_whole_files(tmp_path):
    (tmp_path / "doc.json").write_text('{"data": [1, 2')
    with pytest.raises(SourceUnreadable, match=r"doc.json: not valid JSON"):
        resolve_source(str(tmp_path / "doc.json"))
    (tmp_path / "t.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceUnreadable, match="not a readable Parquet file"):
        resolve_source(str(tmp_path / "t.parquet"))
    (tmp_path / "empty.jsonl").write_text("")
    assert list(resolve_source(str(tmp_path / "empty.jsonl")).rows()) == []


def test_limit_and_fingerprint(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS * 3)
    full = resolve_source(str(path), columns="problem=q,answer=a")
    two = resolve_source(str(path), columns="problem=q,answer=a", limit=2)
    assert len(list(two.rows())) == 2 and full.fingerprint != two.fingerprint
    assert resolve_source(str(path), columns="problem=q,answer=a").fingerprint == full.fingerprint
    with pytest.raises(SourceError, match="--limit"):
        resolve_source(str(path), limit=0)


def test_synthetic_dispatch():
    if importlib.util.find_spec("grpo_core.data.synthetic") is None:
        pytest.skip("grpo_core.data.synthetic not present")
    adapter = resolve_source("synthetic:arith", split="test", limit=5)
    probs = _problems(adapter)
    assert adapter.split == "eval" and len(probs) == 5
    assert all(isinstance(p, Problem) and p.split == "eval" for p in probs)
    with pytest.raises(SourceError, match="unknown synthetic task"):
        resolve_source("synthetic:geometry")


def test_synthetic_missing_module_is_a_source_error(monkeypatch):
    import grpo_core.data

    monkeypatch.setitem(sys.modules, "grpo_core.data.synthetic", None)  # import raises ImportError
    monkeypatch.delattr(grpo_core.data, "synthetic", raising=False)
    with pytest.raises(SourceError, match="not available"):
        resolve_source("synthetic:arith")
