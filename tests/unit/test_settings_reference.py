"""Issue 25 item 14: every UPWELL_* setting is in one reference table in docs/operate.md, generated from the
settings object, and the two stay equal."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from upwell import settingsdoc
from upwell.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "run `.venv/bin/upwell settings --write-docs` and commit docs/operate.md"
SOURCES = ("upwell", "workers", "handlers")


def _named_in_code() -> set[str]:
    found = set(re.findall(r"\bUPWELL_[A-Z0-9_]*[A-Z0-9]\b", (ROOT / "function_app.py").read_text()))
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and path.is_file():
                found |= set(re.findall(r"\bUPWELL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    return found


def test_the_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "operate.md").read_text()
    start, end = text.find(settingsdoc.BEGIN), text.find(settingsdoc.END)
    assert start >= 0 and end > start, f"docs/operate.md lost its settings markers; {REGENERATE}"
    assert text[start:end + len(settingsdoc.END)] == settingsdoc.markdown(), \
        f"docs/operate.md's settings table differs from the settings object: {REGENERATE}"


def test_every_setting_the_code_reads_is_in_the_reference():
    documented = {d.var for d in settingsdoc.reference()}
    missing = sorted(_named_in_code() - documented)
    assert not missing, (f"UPWELL_ settings without a line in the reference: {missing}. Declare one in the "
                         "comment where upwell/settings.py's Settings field is (`# UPWELL_<NAME>: what it does`), or, "
                         f"for a setting read elsewhere, in upwell/settingsdoc.py's ELSEWHERE; then {REGENERATE}")
    stale = sorted(documented - _named_in_code())
    assert not stale, f"the reference names settings no code reads: {stale}"


def test_every_settings_field_names_its_variable_and_says_what_it_does():
    described = {d.var: d for d in settingsdoc.reference()}
    notes = settingsdoc._comments()
    assert set(notes) == {f.name for f in fields(Settings)} - {"connection"}, sorted(notes)
    assert all(described[var].what for var, _ in notes.values()), [v for v, w in notes.values() if not w]
    assert described["UPWELL_CLI_START_WAIT_S"].default == "20"
    assert described["UPWELL_POOLS"].default == "cpu, mpi, gpu"


def test_write_docs_rewrites_only_between_the_markers(tmp_path):
    page = tmp_path / "operate.md"
    page.write_text(f"# x\n\nbefore\n\n{settingsdoc.BEGIN}\n| old |\n{settingsdoc.END}\n\nafter\n")
    assert settingsdoc.write_docs(page) is True
    assert page.read_text() == f"# x\n\nbefore\n\n{settingsdoc.markdown()}\n\nafter\n"
    assert settingsdoc.write_docs(page) is False
