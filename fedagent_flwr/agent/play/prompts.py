"""Agent prompts and action parsing, in the FedAgent reference style, or AgentGym's.

The agent sees its task, the last `history_length` (observation, action) pairs,
the current observation and the admissible actions, and answers
`<think>...</think><action>...</action>` (rollout.prompt-template = agentgym: `Thought: ... Action: ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envs import TextEnv, answer_token_budget
from fedagent_flwr.config import RunConfig
from fedagent_flwr.config.choices import ANSWER_PARSING, PROMPT_ROLES, PROMPT_TEMPLATES

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_OPEN_ACTION_RE = re.compile(r"<action>(.*)", re.IGNORECASE | re.DOTALL)
# Long admissible lists (e.g. every Wordle word) are summarised rather than listed.
MAX_LISTED_ACTIONS = 50
ANSWER_FORMAT = "Reason briefly in <think></think>, then give one admissible action in <action></action>."
REFERENCE_ANSWER_FORMAT = ("It is your move now. Reason step by step about the situation first, and put that reasoning "
                           "inside <think> </think> tags. Then choose one admissible action for this step and put it "
                           "inside <action> </action> tags.")


AGENTGYM_ANSWER_FORMAT = ("Answer in two parts: first \"Thought:\" and, on the lines after it, your reasoning about "
                          "this step; then \"Action:\" and, on the next line, one admissible action, written exactly "
                          "as it is listed:\nThought:\n<your reasoning>\n\nAction:\n<one action>")


def new_tokens(cfg: RunConfig) -> int:
    """Tokens generated per agent step: rollout.max-completion-length, or the environment's need."""
    return cfg.rollout.max_completion_length or answer_token_budget(cfg.env)


def system_prompt(env: TextEnv) -> str:
    """The system message of rollout.prompt-roles=system."""
    return f"{env.intro} {ANSWER_FORMAT}"


def build_prompt(env: TextEnv, observation: str, history: list[tuple[str, str]], history_length: int,
                 roles: str = "user", template: str = "compact") -> str:
    """The user message for the current step; `history` holds all past (observation, action) pairs."""
    if roles not in PROMPT_ROLES:
        raise ValueError(f"rollout.prompt-roles={roles!r} is not allowed: expected {' | '.join(PROMPT_ROLES)}")
    if template == "reference":
        return reference_prompt(env, observation, history, history_length)
    if template == "agentgym":
        return agentgym_prompt(env, observation, history, history_length)
    if template != "compact":
        raise ValueError(f"rollout.prompt-template={template!r} is not allowed: expected {' | '.join(PROMPT_TEMPLATES)}")
    standing = roles == "user"
    lines = [f"{env.intro} Your task: {env.instruction()}" if standing else f"Your task: {env.instruction()}"]
    if history_length == 0:
        # The reference's no-history template shows no step counter either: with it, a
        # Markov task such as Maze would tie each position to the step it is usually
        # reached at, and a start position seen only at later steps in training would
        # look new at step 1 of a held-out episode.
        lines.append(f"Current observation: {observation}")
        lines.append(f"Admissible actions: {_describe_actions(env)}.")
        if standing:
            lines.append(ANSWER_FORMAT)
        return "\n".join(lines)
    steps_taken = len(history)
    recent = history[-history_length:]
    if steps_taken == 0:
        lines.append("You have taken no step yet.")
    else:
        first = steps_taken - len(recent) + 1
        lines.append(f"You have taken {steps_taken} step(s). The last {len(recent)}:")
        lines.extend(f"[{first + i}] observation: {obs} action: {act}" for i, (obs, act) in enumerate(recent))
    lines.append(f"Step {steps_taken + 1}. Observation: {observation}")
    lines.append(f"Admissible actions: {_describe_actions(env)}.")
    if standing:
        lines.append(ANSWER_FORMAT)
    return "\n".join(lines)


def reference_prompt(env: TextEnv, observation: str, history: list[tuple[str, str]], history_length: int) -> str:
    """The reference's single user message: the introduction and task; from the second step on (history_length > 0)
    the steps taken and the last `history_length` as [Observation i: '...', Action i: '...'] lines; the step and the
    current observation; the admissible actions quoted (ALFWorld's layout, or WebShop's one per line:
    TextEnv.reference_actions_per_line); then the answer format. Departures: the task is named at the first step too
    (ALFWorld's first observation names it there; ours do not all), and long action lists are summarised as in the
    compact template (MAX_LISTED_ACTIONS)."""
    task = env.instruction().removeprefix("Your task is to: ")  # ALFWorld's instruction says it already
    lines = [f"{env.intro} Your task is to: {task}"]
    recent = history[-history_length:] if history_length > 0 else []
    if recent:
        first = len(history) - len(recent) + 1
        past = "\n".join(f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']" for i, (obs, act) in enumerate(recent))
        lines.append(f"Before this step you have taken {len(history)} step(s). The most recent {len(recent)} "
                     f"observations, each with the action you took after it: {past}")
        lines.append(f"You are at step {len(history) + 1} now, and the current observation is: {observation}")
    else:
        lines.append(f"The current observation is: {observation}")
    lines.append(f"The actions admissible now are: {_describe_actions(env, reference=True)}.")
    return "\n".join(lines) + "\n\n" + REFERENCE_ANSWER_FORMAT


def agentgym_prompt(env: TextEnv, observation: str, history: list[tuple[str, str]], history_length: int) -> str:
    """AgentGym's episode as one user message: its opening turn (the environment's introduction and the answer form),
    the task, the last `history_length` steps as "Observation: ... / Action: ..." pairs (AgentGym replays the whole
    conversation; rollout.history-length caps it, as a context length would), the current observation and the admissible
    actions. Departures: one message rather than alternating turns, and the task and admissible actions stated in
    our words where AgentGym's servers put them into the observation."""
    lines = [f"{env.intro} Your task: {env.instruction()}", AGENTGYM_ANSWER_FORMAT]
    recent = history[-history_length:] if history_length > 0 else []
    for obs, act in recent:
        lines.append(f"Observation:\n{obs}\nAction:\n{act}")
    lines.append(f"Observation:\n{observation}")
    lines.append(f"Admissible actions: {_describe_actions(env)}.")
    return "\n\n".join(lines)


def _describe_actions(env: TextEnv, reference: bool = False) -> str:
    """The admissible actions as a prompt lists them, or the environment's summary of a long list. reference: quoted,
    in ALFWorld's layout or WebShop's one a line (TextEnv.reference_actions_per_line), ALFWorld's `help` left out."""
    hint = getattr(env, "action_hint", None)
    actions = [a for a in env.admissible_actions() if not (reference and a == "help")]
    if callable(hint) and len(actions) > MAX_LISTED_ACTIONS:
        return hint()
    if not reference:
        return "[" + ", ".join(actions) + "]"
    if env.reference_actions_per_line:
        return "[\n" + "\n".join(f"'{a}'," for a in actions) + "\n]"
    return "[" + "\n ".join(f"'{a}'" for a in actions) + "]"


def expert_completion(action: str, think_limit: int | None = None, template: str = "compact") -> str:
    """What behaviour cloning teaches the model to write for an expert action, in the answer form of `template`.

    The think names the action. With `think_limit`, an action longer than that many characters
    is named by its verb only (`search[...]` -> `search`): copying a long WebShop query twice
    doubles the answer, and a tiny model's second copy is where it overruns the token budget.
    """
    named = action if think_limit is None or len(action) <= think_limit else action.split("[", 1)[0].strip()
    if template == "agentgym":
        return f"Thought:\nnext: {named}\n\nAction:\n{action}"
    return f"<think>next: {named}</think><action>{action}</action>"


@dataclass(frozen=True)
class ParsedAction:
    action: str  # text handed to the environment
    well_formed: bool  # exactly one <think> block and one <action> block


# How AgentGym's clients (agentenv/envs/*.py) take the action out of "Thought: ... Action: ..." (TextEnv.agentgym_reading):
# "line" (BabyAI, TextCraft): the first non-blank line after each "Action:", refused when there are several, then
# only letters, digits, commas and spaces kept and runs of spaces collapsed; "last" (WebShop): all after the last
# "Action:", or the whole text where there is none but it holds search[ or click[; "first" (Maze, Wordle, and our
# other environments): all between the first and any second "Action:", or the whole text where there is none.
AGENTGYM_READINGS = ("line", "last", "first")
_AGENTGYM_LINE_RE = re.compile(r"Action:\s*(.*?)(?=\n|$)", re.DOTALL)
_AGENTGYM_CLEAN_RE = re.compile(r"[^A-Za-z0-9, ]+")
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")  # the reference refuses answers with Chinese characters (Qwen switches)
_FENCE_RE = re.compile(r"```[a-zA-Z]*\n?(.*?)```", re.DOTALL)


def _lenient_action(completion: str) -> ParsedAction | None:
    """What real chat models write instead of the exact format, read for what it means: the whole answer in a
    code fence, one <action> block without a <think> block, an action wrapped in quotes or backticks. None when
    the text has no single action block even then."""
    text = _FENCE_RE.sub(lambda m: m.group(1), str(completion))
    actions = _ACTION_RE.findall(text)
    if len(actions) != 1:
        return None
    action = actions[0].strip().strip("`'\"").strip()
    return ParsedAction(action, bool(action) and len(_THINK_RE.findall(text)) <= 1)


def _reference_action(completion: str, tail_chars: int) -> ParsedAction:
    """The FedAgent reference's reading (verl-agent's alfworld/ and webshop/projection.py, as vendored in
    sunblaze-ucb/FedAgent): the text lowercased; the action between the first <action> and the first </action>,
    stripped; without both tags, the last `tail_chars` characters. Well formed when both action tags and both
    think tags occur anywhere and no Chinese character does."""
    text = str(completion)
    lowered = text.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    if start == -1 or end == -1:
        return ParsedAction(lowered[-tail_chars:], False)
    think = "<think>" in text and "</think>" in text  # the reference looks for them case-sensitively, in any order
    return ParsedAction(lowered[start + len("<action>"):end].strip(), think and not _CJK_RE.search(text))


def _agentgym_action(completion: str, reading: str) -> ParsedAction:
    """AgentGym's reading of a ReAct answer (AGENTGYM_READINGS). Well formed when it has exactly one "Action:" and
    the action is not empty: AgentGym itself penalises nothing, and an answer it had to guess at is what the
    rollout.invalid-action penalty is for."""
    text = str(completion)
    markers = text.count("Action:")
    if reading == "line":
        found = _AGENTGYM_LINE_RE.findall(text)
        if len(found) > 1:  # AgentGym sends nothing and answers with an error: no action this step
            return ParsedAction("", False)
        action = " ".join(_AGENTGYM_CLEAN_RE.sub("", found[0] if found else "").split())
    elif reading == "last":
        if markers:
            action = text.rsplit("Action:", 1)[1].strip()
        else:
            action = text.strip() if ("search[" in text or "click[" in text) else ""
    elif reading == "first":
        action = text.split("Action:")[1].strip() if markers else text.strip()
    else:
        raise ValueError(f"agentgym reading must be one of {AGENTGYM_READINGS}, got {reading!r}")
    return ParsedAction(action, markers == 1 and bool(action))


def parse_action(completion: str, parsing: str = "strict", tail_chars: int = 30, agentgym_reading: str = "first") -> ParsedAction:
    """Extract the action from a model completion; never raises.

    Malformed text is still turned into the best-guess action (the environment then
    judges admissibility) but is flagged so the rollout.invalid-action penalty applies.
    `parsing="strict"`: exactly one <think> and one <action> block, the last action block otherwise;
    "lenient" also accepts the variants of `_lenient_action`; "reference" is the FedAgent reference's own
    reading (`_reference_action`, with the environment's `tail_chars`, TextEnv.reference_tail_chars); "agentgym"
    is AgentGym's (`_agentgym_action`, with the environment's TextEnv.agentgym_reading).
    """
    if parsing == "reference":
        return _reference_action(completion, tail_chars)
    if parsing == "agentgym":
        return _agentgym_action(completion, agentgym_reading)
    if parsing == "lenient":
        lenient = _lenient_action(completion)
        if lenient is not None:
            return lenient
    elif parsing != "strict":
        raise ValueError(f"answer parsing must be one of {ANSWER_PARSING}, got {parsing!r}")
    text = str(completion)
    actions = _ACTION_RE.findall(text)
    if len(actions) == 1:
        return ParsedAction(actions[0].strip(), len(_THINK_RE.findall(text)) == 1)
    if actions:  # several action blocks: take the last, but it is not well formed
        return ParsedAction(actions[-1].strip(), False)
    unclosed = _OPEN_ACTION_RE.search(text)
    if unclosed:
        return ParsedAction(unclosed.group(1).strip(), False)
    # No tags at all: hand over the text after any reasoning block.
    return ParsedAction(_THINK_RE.sub("", text).strip(), False)
