"""Experiment commands (`python -m fedagent_flwr.experiments.<name>`), built on the library below them."""
