"""docs/multi-gpu.md's host memory figures are the ones the raw outputs give (experiments/host_memory.py)."""

from fedagent_flwr.experiments import host_memory


def test_the_deployment_page_quotes_the_host_memory_its_records_give():
    text = host_memory.DOC.read_text()
    assert host_memory.with_block(text, host_memory.BLOCK, host_memory.lines()) == text, \
        "run: python -m fedagent_flwr.experiments.host_memory --write"


def test_a_changed_figure_is_caught():
    text = host_memory.DOC.read_text()
    edited = text.replace("planned (", "planned (9", 1)
    assert edited != text and host_memory.with_block(edited, host_memory.BLOCK, host_memory.lines()) != edited
