"""What the environment receives when the model's action is not admissible as written.

`exact` (the default, as in the FedAgent reference): the text as generated; the environment
answers an inadmissible action with its rollout.invalid-action observation.
`closest`: the admissible action most similar to the text (thefuzz's ratio), a common remedy
for small models that almost copy a long id (`click[b0mwppj0]` for `click[b0mwppj0q7]`). The
step still counts as invalid, and is penalised, unless the text was admissible as written, so
training keeps pushing towards exact actions; the matched action is what the episode records.
"""

from __future__ import annotations

from thefuzz import fuzz, process

from envs import TextEnv, normalize_action
from fedagent_flwr.config.choices import ACTION_MATCHING


def match_action(env: TextEnv, action: str, mode: str) -> tuple[str, bool]:
    """(action to execute, whether `action` was admissible as written)."""
    if mode == "exact":
        return action, True  # the environment judges admissibility itself
    if mode != "closest":
        raise ValueError(f"action matching must be one of {ACTION_MATCHING}, got {mode!r}")
    normalized = normalize_action(action)
    if env.is_admissible(normalized):
        return normalized, True
    # Placeholders such as WebShop's `search[<your query>]` are descriptions, not actions.
    choices = [a for a in env.admissible_actions() if "<your " not in a]
    if not normalized or not choices:  # an empty answer is close to nothing
        return normalized, False
    # processor=None: both sides are already normalised, and the default processor would strip
    # a text such as "<>" to nothing (a warning per step, every candidate scored 0).
    best, _score = process.extractOne(normalized, choices, scorer=fuzz.ratio, processor=None)
    return best, False
