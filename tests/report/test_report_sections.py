"""Report sections are registered in one place (quantbench.report.document.SECTIONS): each writer declares its
registered SECTION, and the report orders fragments by the table."""

from __future__ import annotations

import importlib

import pytest

from quantbench.report import document


@pytest.mark.parametrize("section", [s for s in document.SECTIONS if s.writer], ids=lambda s: s.name)
def test_every_writer_declares_its_registered_section(section):
    assert importlib.import_module(section.writer).SECTION == section.name


def test_an_unregistered_section_is_refused():
    with pytest.raises(ValueError, match=r"report section 'gallery' is not registered"):
        document.registered("gallery")


def test_fragments_follow_the_table_then_the_alphabet(tmp_path):
    for name in ("zeta", "alpha", *reversed(document.SECTION_ORDER)):
        document.write_section(name, f"## {name}\n", tmp_path)
    assert document.sections(tmp_path) == [*document.SECTION_ORDER, "alpha", "zeta"]
