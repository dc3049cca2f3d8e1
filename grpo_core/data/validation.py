"""Row validation at ingest: repair mis-escaped LaTeX, refuse text that is not clean
Unicode (NUL, invalid UTF-8, control characters, mojibake), cap sizes, require a gold
answer that parses, and sort an adapter's rows into accepted, rejected and duplicate,
counted in an `IngestReport`. grpo_core.data.store runs this inside one ingest and re-exports
the public names; this module imports nothing of the store."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_core.data.problems import Problem, text_key
from grpo_core.data.readers import BadRow, Rejection
from grpo_core.data.source import Adapter

MAX_PROBLEM_CHARS = 20000
MAX_ANSWER_CHARS = 1000
_MIS_ESCAPED = {"\x07": "\\a", "\x08": "\\b", "\x0b": "\\v", "\x0c": "\\f"}
# JSON written with "\frac" unescaped decodes to form feed + "rac" (seen in aime25).
_REPAIRABLE = re.compile(r"[\x07\x08\x0b\x0c](?=[A-Za-z])")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# A UTF-8 lead byte followed by continuation bytes, all read as cp1252/Latin-1: mojibake.
_MOJIBAKE = re.compile("[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d"
                       "\u017e\u0192\u02c6\u02dc\u2013\u2014\u2018-\u201a\u201c-\u201e"
                       "\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122]+")


_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def undecodable(text: str) -> str | None:
    """Why `text` is not clean Unicode text (None if it is)."""
    if text.isascii() and not _ASCII_CONTROL.search(text):
        return None  # most rows: and no surrogate, U+FFFD or mojibake can hide in ASCII
    if "\x00" in text:
        return "NUL byte"
    if m := _SURROGATE.search(text):
        return f"invalid UTF-8 byte 0x{ord(m.group()) & 0xFF:02X} (mixed encodings?)"
    if "\ufffd" in text:
        return "U+FFFD replacement character (decoded lossily upstream)"
    if m := _CONTROL.search(text):
        return f"control character U+{ord(m.group()):04X}"
    for m in _MOJIBAKE.finditer(text):
        for codec in ("cp1252", "latin-1"):
            try:
                fixed = m.group().encode(codec).decode("utf-8")
            except UnicodeError:
                continue
            return f"mojibake {m.group()!r} (UTF-8 read as {codec}; meant {fixed!r})"
    return None


def check_text(p: Problem) -> tuple[Problem, bool] | Rejection:
    """Repair mis-escaped LaTeX control characters, then refuse any other bad text."""
    changes = {}
    for name in ("problem", "answer", "solution"):
        value = getattr(p, name)
        fixed = _REPAIRABLE.sub(lambda m: _MIS_ESCAPED[m.group()], value) if value else value
        if fixed != value:
            changes[name] = fixed
    if changes:
        p = replace(p, **changes, fingerprint="")  # fingerprint recomputed on the fixed text
    for name in ("problem", "answer", "solution", "subject", "id"):
        value = getattr(p, name)
        if value and (why := undecodable(value)):
            return Rejection("undecodable", f"{name}: {why}")
    return p, bool(changes)


def check_size(p: Problem, max_chars: int) -> Rejection | None:
    for name, limit in (("problem", max_chars), ("answer", MAX_ANSWER_CHARS),
                        ("solution", 4 * max_chars)):
        if len(getattr(p, name)) > limit:
            return Rejection("too_long", f"{name} is {len(getattr(p, name))} chars (max {limit})")
    return None


GOLD_DEADLINE_S = 2.0  # per gold at ingest; the reward-time deadline is far tighter
GOLD_MEMO = 100_000  # distinct answer texts remembered as parsing during one ingest


@contextmanager
def patient_gold_parsing(seconds: float = GOLD_DEADLINE_S) -> Iterator[None]:
    """Raise parse_gold's per-gold deadline (grpo_core.verify.gold) while ingesting.

    parse_gold returns None both for an unparseable gold and for one that overran its
    (reward-time, 0.3 s) deadline; on a loaded machine the latter quarantined hundreds of
    valid MATH rows. Whether a row is valid must not depend on the machine's load.
    """
    from grpo_core.verify import gold

    old = gold.GOLD_DEADLINE_S
    gold.GOLD_DEADLINE_S = max(old, seconds)
    try:
        yield
    finally:
        gold.GOLD_DEADLINE_S = old


def check_gold(p: Problem, parses: dict[str, bool] | None = None) -> Rejection | None:
    """None when the gold parses. `parses` (answer text -> parses?) spares asking again for
    an answer seen before: golds repeat ("6", "12") across a large pool."""
    from grpo_core.verify.gold import parse_gold

    ok = parses.get(p.answer) if parses is not None else None
    if ok is None:
        try:
            ok = parse_gold(p.answer) is not None
        except Exception:  # noqa: BLE001 - a gold that crashes the parser is unparseable
            ok = False
        if parses is not None and ok:  # a failure may be a deadline: asked again next time
            parses[p.answer] = ok
    return None if ok else Rejection("unparseable_answer", f"gold {p.answer[:80]!r} does not parse")


def _validate(adapter: Adapter, index: int, raw: Any,
              max_chars: int) -> tuple[Problem, bool] | Rejection:
    if isinstance(raw, BadRow):
        return raw.rejection
    p = adapter.convert(index, raw)
    if isinstance(p, Rejection):
        return p
    return check_size(p, max_chars) or check_text(p)


@dataclass
class IngestReport:
    """Counts of one ingest. Always: total_rows == ingested + quarantined + duplicates."""

    source: str
    split: str
    origin: str
    total_rows: int = 0
    ingested: int = 0
    duplicates: int = 0  # an earlier row's (this ingest's or the store's) fingerprint or text
    already_stored: int = 0  # of the duplicates, those already in the store
    near_duplicates: int = 0  # of the duplicates, same problem text with another gold
    quarantined: dict[str, int] = field(default_factory=dict)  # reason code -> rows
    contaminated: int = 0  # ingested rows flagged as overlapping an eval set
    contaminated_with: dict[str, int] = field(default_factory=dict)  # eval set -> rows
    flagged_existing: int = 0  # earlier training rows flagged by this (eval) source
    repaired: int = 0  # ingested rows whose mis-escaped LaTeX was repaired
    first_reasons: list[str] = field(default_factory=list)  # "row 3: code: detail"
    seconds: float = 0.0

    @property
    def quarantined_total(self) -> int:
        return sum(self.quarantined.values())

    @property
    def all_invalid(self) -> bool:
        return self.total_rows > 0 and self.quarantined_total == self.total_rows

    def reject(self, index: int, why: Rejection) -> None:
        """Count row `index` as quarantined for `why` (the first five reasons are kept)."""
        self.quarantined[why.code] = self.quarantined.get(why.code, 0) + 1
        if len(self.first_reasons) < 5:
            self.first_reasons.append(f"row {index}: {why}")


Known = Callable[[list[str], list[str]], tuple[set[str], set[str]]]


def check_rows(adapter: Adapter, report: IngestReport, max_chars: int, known: Known,
               write: Callable[[list, list], None], every: int) -> None:
    """Sort every row into accepted, rejected or duplicate (counted in `report`), `every`
    rows at a time, so memory holds one batch whatever the source's size:
    `known(fingerprints, text_keys)` says which of a batch's are already stored (earlier
    batches included) and `write(accepted, rejected)` stores one batch. A duplicate has
    the fingerprint (normalised problem and answer) of a stored or earlier row; a near
    duplicate only its normalised problem text (the same problem, its gold written
    another way): both are counted and dropped, the first occurrence kept."""
    pending: list[tuple[int, Problem, bool, str, Any]] = []
    rejected: list[tuple[int, Rejection, Any]] = []
    parses: dict[str, bool] = {}

    def flush() -> None:
        if len(parses) > GOLD_MEMO:
            parses.clear()  # bounded: memory holds one batch and this memo, whatever the size
        accepted = _distinct_with_gold(pending, report, known, rejected, parses)
        rejected.sort(key=lambda r: r[0])  # reasons reported in row order
        for index, why, _ in rejected:
            report.reject(index, why)
        write(accepted, rejected)
        pending.clear()
        rejected.clear()

    for index, raw in adapter.rows():
        report.total_rows += 1
        checked = _validate(adapter, index, raw, max_chars)
        if isinstance(checked, Rejection):
            rejected.append((index, checked, raw.raw if isinstance(raw, BadRow) else raw))
        else:
            pending.append((index, *checked, text_key(checked[0].problem), raw))
        if len(pending) + len(rejected) >= every:
            flush()
    flush()


def _distinct_with_gold(pending: list, report: IngestReport, known: Known, rejected: list,
                        parses: dict[str, bool]) -> list[tuple[int, Problem, str]]:
    """The batch's rows that are neither duplicates nor near duplicates, and whose gold
    parses (the costly check, run once per distinct row)."""
    if not pending:
        return []
    stored_fps, stored_keys = known([r[1].fingerprint for r in pending],
                                    [r[3] for r in pending])
    seen_fps: set[str] = set()
    seen_keys: set[str] = set()
    accepted = []
    for index, p, repaired, key, raw in pending:
        if p.fingerprint in stored_fps or p.fingerprint in seen_fps:
            report.duplicates += 1
            report.already_stored += p.fingerprint in stored_fps
        elif key in stored_keys or key in seen_keys:
            report.duplicates += 1
            report.near_duplicates += 1
        elif (why := check_gold(p, parses)) is not None:
            rejected.append((index, why, raw))
        else:
            seen_fps.add(p.fingerprint)
            seen_keys.add(key)
            report.repaired += repaired
            accepted.append((index, p, key))
    return accepted
