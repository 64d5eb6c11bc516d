"""`python -m fedagent_flwr.experiments.warm_start`: a supervised warm start of any model on an environment's
scripted-expert demonstrations, written as a checkpoint folder that any run can use with `model=<folder>`.

Why: GRPO learns only from groups whose rewards differ. A model that never writes the answer format (a random
tiny model, or a real instruct model such as SmolLM2-135M zero-shot, which writes prose) earns the same reward
in every episode, so RL has nothing to learn from. A short behaviour-cloning pass on expert steps teaches the
format and a competent-but-imperfect policy that RL can then improve.

The training is TRL's `SFTTrainer` on prompt-completion data: the prompt is the user message the agent sees at
that step (rendered with the model's own chat template, system prompt included where the template adds one),
the completion the expert's answer in the agent's format; the loss covers the completion tokens only. With
`--finetuning lora` the adapter (PEFT, via `peft_config`) is merged into the base before saving, so the folder
is a plain model. Its configuration, the loss curve and the held-out valid-action rate and success before and
after are recorded in `warm_start.json` in the folder. The training itself is agent/models/warm_start.py's, which also
builds the cached `model = "warm:<base>"` models.

    python -m fedagent_flwr.experiments.warm_start --model smollm2-135m-instruct --env maze --out ~/warm/smollm2-maze
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from fedagent_flwr.agent.engine.placement import place
from fedagent_flwr.agent.models.loading import load_agent
from fedagent_flwr.agent.models.warm_start import WarmStartConfig, save_warm_model, train_warm_start


def warm_start(cfg: WarmStartConfig) -> dict:
    """Warm-start `cfg.model` on `cfg.env` and write the folder `cfg.out` (with warm_start.json)."""
    cfg.check()
    out = Path(cfg.out).expanduser()
    agent = load_agent(cfg.model, cfg.env, cfg.device)
    placement = place(device=cfg.device, model=agent.model)  # every auto as a run on this machine resolves it
    model, report = train_warm_start(agent.model, agent.tokenizer, placement, cfg)
    report["source"] = agent.spec.source
    agent.model = model
    save_warm_model(model, agent.tokenizer, report, out)
    print(f"[warm-start] wrote {out} (use model='{out}')", flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedagent_flwr.experiments.warm_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = WarmStartConfig(model="", env="", out="")
    p.add_argument("--model", required=True, help="a HF name or folder, a .gguf file, smollm2-135m-instruct, or tiny:<env>")
    p.add_argument("--env", default="maze")
    p.add_argument("--out", required=True, help="the checkpoint folder to write (must not exist or be empty)")
    for name, value in asdict(defaults).items():
        if name in ("model", "env", "out"):
            continue
        if isinstance(value, bool):
            p.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    cfg = WarmStartConfig(**vars(p.parse_args(argv)))
    try:
        cfg.check()  # every bad flag refused before any model is loaded
    except ValueError as err:
        p.error(str(err))
    warm_start(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
