"""`python -m fedagent_flwr.evaluation`: a model's held-out play, its metrics and (--transcripts) the episodes as
text, on the device of your choice; the same command as `python -m fedagent_flwr.experiments.evaluate`."""

from fedagent_flwr.experiments.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
