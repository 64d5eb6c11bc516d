"""Every generated block and figure of README.md and docs/ is what its generator computes from the records in
benchmarks/results/ (scripts/write_docs.py; the forms: fedagent_flwr/experiments/doc_blocks.py). An edited digit in a
page, or an edited record, fails here; so does a marker that no generator writes."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("write_docs", ROOT / "scripts" / "write_docs.py")
write_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(write_docs)

from fedagent_flwr.experiments import doc_blocks  # noqa: E402


@pytest.mark.parametrize("generator", [f.relative_to(ROOT).as_posix() for f in write_docs.generator_files()])
def test_a_generators_parts_read_on_their_pages_as_it_computes_them(generator):
    parts = write_docs.load(ROOT / generator).doc_parts()
    assert parts, f"{generator} defines doc_parts() and writes nothing"
    assert doc_blocks.stale(parts) == [], "run: python scripts/write_docs.py"


def test_every_marker_on_the_pages_is_written_by_a_generator():
    pages = write_docs.regenerated()  # raises, naming the page and the marker, where none writes one
    assert {"README.md", "docs/results.md"} <= set(pages)
    assert all(now == new for now, new in pages.values()), "run: python scripts/write_docs.py"


def test_the_registry_names_each_numbers_generator_value_and_records():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "write_docs.py"), "--records-of",
                           str(ROOT / "fedagent_flwr" / "experiments" / "claims.py")], capture_output=True, text=True,
                          timeout=300, check=True)
    entry = json.loads(done.stdout.splitlines()[-1])
    assert entry["function"] == "fedagent_flwr/experiments/claims.py:doc_parts"
    figure = next(p for p in entry["parts"] if p["name"] == "precision-fp32-minus-bf16")
    assert figure["page"] == "docs/performance.md" and figure["value"].startswith(("+", "-"))
    # every run a claim links is read to compute it, and nothing outside benchmarks/results/ is named
    from fedagent_flwr.experiments import claims

    linked = {r.relative_to(ROOT / "benchmarks" / "results").as_posix() for c in claims.CLAIMS for r in c.records}
    assert linked == {"/".join(f.split("/")[:-1]) if "/episodes/" not in f else f.split("/episodes/")[0]
                      for f in entry["records"]}
