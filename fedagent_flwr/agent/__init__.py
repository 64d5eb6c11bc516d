"""The agent's Flower-free core: models, prompts, rollouts, GRPO, SFT, LoRA, Fed-SE's round, evaluation."""
