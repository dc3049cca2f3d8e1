"""Whether a recipe verdict still describes today's champions.

A comparison's verdict ("sft_grpo beats r1_zero by +0.087 [...]") is about the models that
comparison trained and registered. A later retrain or pipeline run may promote a newer
version of one of them; the verdict then speaks of models older than the champion, and says
so: each verdict records, per registered model, the version it was computed with and the
champion at the time (`recorded`), and is stale when a model's champion is now a newer
version than the one the verdict was computed with.

    recorded = {"recipes-r1_zero": {"version": "2", "champion": "2"}, ...}
    computed_with(recorded) -> "computed with recipes-r1_zero v2 (champion), ..."
    stale(recorded, {"recipes-r1_zero": "3"}) -> {"recipes-r1_zero": ("2", "3")}
    stale_line(...) -> "STALE: recipes-r1_zero's champion is now v3, newer than the v2 ..."
"""
from __future__ import annotations

from collections.abc import Mapping


def _num(version) -> int:
    try:
        return int(version)
    except (TypeError, ValueError):
        return -1


def computed_with(recorded: Mapping[str, Mapping]) -> str:
    """"computed with recipes-r1_zero v2 (champion), recipes-sft_grpo v1 (champion v3 then)"."""
    def one(name: str, r: Mapping) -> str:
        champ = r.get("champion")
        said = ("champion" if str(champ) == str(r["version"])
                else f"champion v{champ} then" if champ else "no champion then")
        return f"{name} v{r['version']} ({said})"

    return "computed with " + ", ".join(one(n, r) for n, r in recorded.items()) if recorded else ""


def stale(recorded: Mapping[str, Mapping], champions: Mapping[str, str | None]
          ) -> dict[str, tuple[str, str]]:
    """{model: (the verdict's version, the champion now)} for each model whose champion is
    now newer than the version the verdict was computed with."""
    return {name: (str(r["version"]), str(champions[name])) for name, r in recorded.items()
            if champions.get(name) is not None and _num(champions[name]) > _num(r["version"])}


def stale_line(found: Mapping[str, tuple[str, str]]) -> str:
    """One line saying which champions moved on ("" when none did)."""
    if not found:
        return ""
    moved = "; ".join(f"{name}'s champion is now v{now}, newer than the v{was} this verdict "
                      f"was computed with" for name, (was, now) in found.items())
    return f"STALE: {moved}. Run the comparison again (`grpo run`) for a current verdict."


def under_verdict(note: str, line: str) -> str:
    """A description `note` with `line` as its second line (under the verdict's first)."""
    head, _, rest = note.partition("\n")
    return f"{head}\n{line}\n{rest}" if note else line


def with_stale_line(note: str, line: str) -> str:
    """`note` with its leading STALE paragraph replaced by `line` (removed when "")."""
    body = note.split("\n\n", 1)[1] if note.startswith("STALE: ") and "\n\n" in note else note
    return f"{line}\n\n{body}" if line else body
