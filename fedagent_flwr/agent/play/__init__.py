"""How the agent plays a text environment: prompts and answer parsing, batched multi-turn rollouts, evaluation,
transcripts. Imports the engine only."""
