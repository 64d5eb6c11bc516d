"""How the agent learns from what it played: GRPO, supervised fine-tuning (TRL), LoRA adapters (PEFT), the weights'
wire form, Fed-SE's experience buffer. Imports the engine and play."""
