"""The real-model numbers the docs quote are what the kept run records give. docs/results.md's tables under "What holds
today" are read from the page itself: every row names its records (benchmarks/results/<day>/runs/<run>, the
scripts/keep_run_records.py layout), and each number of the row is recomputed from them with the paired tests of
experiments/paired_rounds.py. The SmolLM2 preset's comments may quote only numbers those verified rows hold (the
README's table is generated from the records: tests/app/test_claims.py). Editing a number in a doc, or a record, fails these; they read JSON and Markdown
only, so they cost nothing in the default suite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedagent_flwr.experiments.paired_rounds import compare, compare_runs, evaluation_rounds, over_seeds, success_rounds
from fedagent_flwr.experiments.protocols import category_tests, spent

ROOT = Path(__file__).resolve().parents[2]
RESULTS_MD = ROOT / "docs" / "results.md"
LINK = re.compile(r"\]\(\.\./(benchmarks/results/[^)]+)\)")


def claim_tables(text: str) -> list[tuple[list[str], list[str]]]:
    """(header cells, row cells) of every Markdown table row with a records column, in the page's real-model part."""
    part = text.split("## What holds today", 1)[1].split("\n## ", 1)[0]
    rows, header = [], None
    for line in part.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("- "):
            if any(h.startswith("records") for h in header):
                rows.append((header, cells))
    return rows


def records(cell: str) -> list[list[Path]]:
    """The record folders of a records cell: groups split by ';' (first; second), folders by ','."""
    groups = [[ROOT / m for m in LINK.findall(part)] for part in cell.split(";")]
    for folder in (f for g in groups for f in g):
        assert (folder / "summary.json").is_file() or (folder / "episodes").is_dir(), folder
    return groups


def last_minus_first(run: Path) -> tuple[float, float]:
    s = success_rounds(run)
    return s[max(s)], s[min(s)]


def _pm(cell: str) -> tuple[str, str]:
    mean, se = re.fullmatch(r"([+-]\d\.\d{3}) ± (\d\.\d{3})", cell).groups()
    return mean, se


def verify_categories(header: list[str], row: dict[str, str], run: Path) -> set[str]:
    """A row of held-out success (%) per category and overall after the last round (the base model's row: before
    round 1), with the episodes and AdamW steps the run spent in training (protocols.spent)."""
    summary = json.loads((run / "summary.json").read_text())
    base = row["method"].startswith("base model")
    success = summary["initial" if base else "final"]
    columns = header[header.index("method") + 1:header.index("overall") + 1]
    columns = [c for c in columns if c != "seed"]
    for c in columns:
        value = success["success_rate" if c == "overall" else f"success_rate/{c}"]
        assert f"{100 * value:.1f}" == row[c], (row, c)
    used = {"episodes": 0.0, "optimizer_steps": 0.0} if base else spent(run)
    assert (f"{used['episodes']:.0f}", f"{used['optimizer_steps']:.0f}") == (row["episodes"], row["steps"]), row
    return {row[c] for c in columns} | {row["episodes"], row["steps"]}


def verify(header: list[str], cells: list[str]) -> set[str]:
    """Recompute one row from its records; returns the numbers it quotes (as printed), now verified."""
    row = dict(zip(header, cells))
    groups = records(row[next(h for h in header if h.startswith("records"))])
    if "overall" in row:
        ((run,),) = groups
        return verify_categories(header, row, run)
    if "direction" in row:  # a difference over the held-out rooms of one goal direction (protocols.category_tests)
        (first,), (second,) = groups
        out = category_tests(first, second)[row["direction"]]
        assert f"{out['n']}" == row["rooms"], row
        value = row["difference, paired over the direction's rooms"]
        assert (f"{out['mean']:+.3f} ± {out['se']:.3f}", f"{out['p']:.2g}") == (value, row["p"]), row
        return set(_pm(value)) | {row["p"]}
    value = row.get("gain, paired over 48 rooms") or row["difference, paired over 48 rooms"]
    mean, se = _pm(value)
    over = "over seeds" in row["seed"]
    if "gain, paired over 48 rooms" in row:
        (runs,) = groups
        if over:
            out = over_seeds([last_minus_first(r) for r in runs])
        else:
            (run,) = runs
            rounds = evaluation_rounds(run)
            out = compare(run, rounds[-1], rounds[0])
            assert out["n"] == 48 and out["episodes"] == 144
            before, after = row["held-out before -> after"].split(" -> ")
            assert (f"{out['earlier_success']:.3f}", f"{out['later_success']:.3f}") == (before, after), row
            assert f"{out['mean'] / out['se']:.2f}" == row["gain / SE"], row
            minutes = json.loads((run / "summary.json").read_text())["seconds"] / 60
            assert f"{minutes:.1f}" == row["minutes"], row
    else:
        first, second = groups
        assert len(first) == len(second) and (len(first) > 1) == over, row
        if over:
            out = over_seeds([(last_minus_first(a)[0], last_minus_first(b)[0]) for a, b in zip(first, second)])
        else:
            out = compare_runs(first[0], second[0], evaluation_rounds(first[0])[-1], evaluation_rounds(second[0])[-1])
            assert out["n"] == 48
    assert (f"{out['mean']:+.3f}", f"{out['se']:.3f}") == (mean, se), row
    assert f"{out['p']:.2g}" == row["p"], row
    return {mean, se, row["p"]} | {row.get("gain / SE", ""), row.get("minutes", "")} - {""}


ROWS = claim_tables(RESULTS_MD.read_text())


def test_the_page_has_its_claim_tables():
    """The parser finds the rows (an empty list would make every check below vacuous)."""
    assert len(ROWS) >= 16
    assert sum("over seeds" in cells[0] for _, cells in ROWS) >= 4


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_each_documented_row_is_what_its_records_give(row):
    verify(*ROWS[row])


def verified_numbers() -> set[str]:
    return set().union(*(verify(h, c) for h, c in ROWS))


def quoted(text: str) -> set[str]:
    """Signed results with three decimals (+0.111), standard errors after ±, two-decimal numbers (SE ratios, p) and
    minutes (41.9)."""
    return set(re.findall(r"[+-]\d\.\d{3}\b", text)) | set(re.findall(r"± (\d\.\d{3})", text)) | \
        set(re.findall(r"(?<![\d.])\d\.\d{2}(?![\d.])", text)) | set(re.findall(r"(?<![\d.])\d{2,3}\.\d(?![\d.])", text))


def test_the_readme_and_the_preset_quote_only_verified_real_model_numbers():
    """The README's real-model results are its generated claims table (tests/app/test_claims.py recomputes it from the
    records); the sentences around it quote none. The presets' comments quote only verified rows' numbers."""
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("**A real"):readme.index("**The papers' settings**")]
    around = paragraph.split("<!-- begin generated: claims -->")[0] + paragraph.split("<!-- end generated: claims -->")[1]
    assert not quoted(around), sorted(quoted(around))
    presets = {f"configs/{name}": "\n".join(line for line in (ROOT / "configs" / name).read_text().splitlines()
                                            if line.startswith("#"))
               for name in ("smollm2-fedagent-cpu.toml", "smollm2-fedse-cpu.toml")}
    verified = verified_numbers()
    for where, text in presets.items():
        numbers = quoted(text)
        assert numbers, where  # the comment does quote results
        assert numbers <= verified, (where, sorted(numbers - verified))


def test_the_pages_own_prose_quotes_only_its_verified_rows():
    """The sentences around the tables (not the tables) may repeat a result only as a verified row prints it; the one
    two-decimal number there that is a setting, not a result, is GiGPO's gamma."""
    part = RESULTS_MD.read_text().split("## What holds today", 1)[1].split("\n## ", 1)[0]
    prose = "\n".join(line for line in part.splitlines() if not line.startswith("|"))
    settings = {"0.95"}  # verl-agent's GiGPO gamma
    numbers = quoted(prose) - settings
    assert numbers and numbers <= verified_numbers(), sorted(numbers - verified_numbers())


def test_a_changed_number_is_caught():
    """The check above fails on an edit: one digit moved in a verified row is refused."""
    header, cells = next((h, c) for h, c in ROWS if "gain / SE" in h and "over seeds" not in c[0])
    edited = list(cells)
    i = header.index("gain, paired over 48 rooms")
    edited[i] = edited[i].replace(edited[i][4], str((int(edited[i][4]) + 1) % 10), 1)
    with pytest.raises(AssertionError):
        verify(header, edited)
    assert "+0.999" not in verified_numbers() and not quoted("gained +0.999") <= verified_numbers()


def test_runs_of_one_seed_start_from_the_same_evaluation():
    """The premise of pairing methods room by room and of `eval.initial-evaluation`: with the same model and seed, the
    evaluation before round 1 is the same episodes, here played by two runs on different thread counts (the
    FedAgentAvg run alone on 2 threads, Local's first run with OMP_NUM_THREADS=1 beside two other simulations)."""
    runs = ROOT / "benchmarks" / "results"

    def episodes(run):
        return json.loads((runs / run / "episodes" / "round-0000.json").read_text())["episodes"]

    assert episodes("2026-12-01-cpu/runs/local1-s2-stopped") == episodes("2026-12-01-cpu/runs/fedagent-preset-s2")
    assert episodes("2026-12-01-cpu/runs/gigpo-s1") == episodes("2026-12-01-cpu/runs/fedagent-preset-s1")
    taken = json.loads((runs / "2026-12-01-cpu/runs/local1-s2/episodes/round-0000.json").read_text())
    assert "taken-from" in taken and taken["episodes"] == episodes("2026-12-01-cpu/runs/fedagent-preset-s2")
    taken = json.loads((runs / "2026-12-02-cpu/runs/gigpo-s0/episodes/round-0000.json").read_text())
    assert "grpo-s0" in taken["taken-from"] and taken["episodes"] == episodes("2026-12-02-cpu/runs/fedagent-preset-s0")


def test_the_fedse_preset_under_bf16_base_starts_from_the_fedagent_presets_evaluation():
    """results.md: with both presets holding the base in bf16, each seed of each on the AMD EPYC played the same
    held-out episodes before round 1 (what its table of Fed-SE against FedAgentAvg, room by room, stands on); under
    bf16-mixed Fed-SE did not."""
    runs = ROOT / "benchmarks" / "results"

    def episodes(run):
        return json.loads((runs / run / "episodes" / "round-0000.json").read_text())["episodes"]

    assert episodes("2026-12-06-cpu/runs/fedse-bf16-base-s2-amd") == episodes("2026-12-05-cpu/runs/fedagent-preset-s2-amd")
    fedagent = ["2026-12-02-cpu/runs/fedagent-preset-s0", "2026-12-01-cpu/runs/fedagent-preset-s1",
                "2026-12-01-cpu/runs/fedagent-preset-s2"]
    for seed, run in enumerate(fedagent):
        assert episodes(f"2026-12-06-cpu/runs/fedse-bf16-base-s{seed}-amd") == episodes(run)
        assert episodes(f"2026-12-06-cpu/runs/fedse-eager-s{seed}-amd") == episodes(run)  # the preset since eager
        assert episodes(f"2026-12-06-cpu/runs/fedse-bf16-mixed-s{seed}-amd") != episodes(run)
    page = " ".join(RESULTS_MD.read_text().split())
    assert "seed 2 of both on the AMD EPYC played the same 144 held-out episodes before round 1 (seeds 0 and 1 too)" in page
    for label in ("Fed-SE - FedAgentAvg", "Fed-SE (eager) - FedAgentAvg"):
        table = [cells for header, cells in ROWS if cells[1:2] == [label]]
        assert [c[-1].count(r) for c in table[:3] for r in fedagent] == [2, 0, 0, 0, 2, 0, 0, 0, 2]  # a link names it twice


def same_evaluations_and_rewards(first: Path, again: Path) -> list[tuple[dict, dict]]:
    """Asserts two runs played the same held-out episodes in both evaluations and had the same training rewards and
    successes round by round; returns their trained rounds' metrics, paired, for the caller's own checks."""
    for name in ("round-0000.json", "round-0003.json"):
        assert (json.loads((first / "episodes" / name).read_text())["episodes"]
                == json.loads((again / "episodes" / name).read_text())["episodes"]), name

    def trained(run):
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "train/seconds" in line]

    pairs = list(zip(trained(first), trained(again), strict=True))
    for a, b in pairs:
        assert (a["train/mean_reward"], a["train/success_rate"]) == (b["train/mean_reward"], b["train/success_rate"])
    return pairs


def test_a_seed_repeats_on_one_processor_kind():
    """results.md: seed 2 on an AMD EPYC, 2026-12-01 and 2026-12-05 (many commits apart, the warm start rebuilt),
    played the same held-out episodes in every evaluation and the same training rewards; the update norms agree to
    1e-15 (float sums in another order), and the clocks differ."""
    runs = ROOT / "benchmarks" / "results"
    first, again = runs / "2026-12-01-cpu/runs/fedagent-preset-s2", runs / "2026-12-05-cpu/runs/fedagent-preset-s2-amd"
    for a, b in same_evaluations_and_rewards(first, again):
        assert abs(a["train/update_norm"] - b["train/update_norm"]) < 1e-15
    minutes = [json.loads((r / "summary.json").read_text())["seconds"] / 60 for r in (first, again)]
    page = " ".join(RESULTS_MD.read_text().split())
    assert f"its clock said {minutes[0]:.1f} and {minutes[1]:.1f} minutes" in page and "within 1e-15" in page


def test_the_fedse_presets_seed_0_repeats_across_processors_and_the_loss_heads_change():
    """results.md: the Fed-SE preset in fp32, seed 0, on the Xeon with AMX before the loss head took the completions'
    positions only (2026-12-05) and on the AMD EPYC after it (2026-12-06): the same held-out episodes in both
    evaluations and the same training rewards; the fine-tuning losses agree within 1e-6, rounding apart."""
    runs = ROOT / "benchmarks" / "results"
    first, again = runs / "2026-12-05-cpu/runs/fedse-preset-s0-amx", runs / "2026-12-06-cpu/runs/fedse-preset-s0-amd"
    for a, b in same_evaluations_and_rewards(first, again):
        for key in ("train/loss", "train/fedse/loss-first"):
            assert a[key] != b[key] and abs(a[key] - b[key]) < 1e-6  # rounding moved, nothing more
    page = " ".join(RESULTS_MD.read_text().split())
    assert "the same held-out episodes in both evaluations as on the Xeon with AMX before it" in page
    assert "fine-tuning losses agreed within 1e-6" in page
