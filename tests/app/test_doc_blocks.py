"""The two forms of a generated part of the docs (experiments/doc_blocks.py): what regenerating changes, what it
refuses."""

import pytest

from fedagent_flwr.experiments.doc_blocks import Block, Figure, rendered, stale

PAGE = """# A page

The update takes <!--fig:share-->41 %<!--/fig--> of a round, against <!--fig:eval-->12 %<!--/fig--> for the evaluation.

<!-- begin generated: table -->
| a | b |
| 1 | 2 |
<!-- end generated: table -->
"""
PARTS = [Figure("docs/p.md", "share", "41 %"), Figure("docs/p.md", "eval", "12 %"),
         Block("docs/p.md", "table", ("| a | b |", "| 1 | 2 |"))]


def test_a_page_as_generated_regenerates_to_itself(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text(PAGE)
    assert rendered(PAGE, "docs/p.md", PARTS) == PAGE
    assert stale(PARTS, tmp_path) == []


@pytest.mark.parametrize("old,new,which", [("41 %", "42 %", "figure share"), ("| 1 | 2 |", "| 1 | 3 |", "block table")])
def test_one_edited_digit_is_named(tmp_path, old, new, which):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text(PAGE.replace(old, new))
    assert stale(PARTS, tmp_path) == [f"docs/p.md: {which}"]
    assert rendered(PAGE.replace(old, new), "docs/p.md", PARTS) == PAGE


def test_a_figure_no_generator_writes_is_refused():
    page = PAGE.replace("of a round", "of a round (<!--fig:typed-->7<!--/fig--> by hand)")
    with pytest.raises(ValueError, match="figure typed marked but written by no generator"):
        rendered(page, "docs/p.md", PARTS)


def test_a_figure_marked_twice_is_refused():
    page = PAGE + "Again <!--fig:share-->41 %<!--/fig-->.\n"
    with pytest.raises(ValueError, match="expected one '<!--fig:share-->...<!--/fig-->', found 2"):
        rendered(page, "docs/p.md", PARTS)
