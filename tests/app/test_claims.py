"""The verdict table of the README and of docs/results.md is what experiments/claims.py computes from the kept run records: regenerating it
changes nothing, an edited digit is caught, and each verdict follows the rule the module states."""

import pytest

from fedagent_flwr.experiments import claims


def test_the_readmes_and_the_results_pages_tables_are_generated_from_the_records():
    text = claims.README.read_text()
    assert claims.with_block(text, "claims", claims.table()) == text, "run: python -m fedagent_flwr.experiments.claims --write"
    page = claims.RESULTS_MD.read_text()
    assert claims.with_block(page, "claims", claims.table(with_records=True)) == page
    for claim in claims.CLAIMS:  # every record a row links is kept
        assert claim.records and all((r / "episodes").is_dir() for r in claim.records), claim.text


def test_an_edited_number_in_the_table_is_caught():
    text = claims.README.read_text()
    edited = text.replace("+0.111", "+0.112", 1)
    assert edited != text and claims.with_block(edited, "claims", claims.table()) != edited


@pytest.mark.parametrize("tests,expected", [
    ([{"mean": 0.1, "p": 0.01}], "holds"),
    ([{"mean": 0.1, "p": 0.01}, {"mean": 0.2, "p": 0.001}], "holds in every run"),
    ([{"mean": 0.1, "p": 0.01}, {"mean": 0.2, "p": 0.2}], "not shown"),
    ([{"mean": -0.05, "p": 0.04}], "below it"),
    ([{"mean": 0.05, "p": 0.06}], "not shown"),
])
def test_a_verdict_follows_its_tests(tests, expected):
    assert claims.verdict(tests) == expected
