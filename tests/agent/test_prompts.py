import pytest

from envs import make_env
from fedagent_flwr.agent.play.prompts import build_prompt, expert_completion, parse_action


@pytest.mark.parametrize(
    "text, action, well_formed",
    [
        ("<think>go</think><action>move up</action>", "move up", True),
        ("<think>a</think>\n<action>  Move Down \n</action>", "Move Down", True),
        ("<action>move up</action>", "move up", False),  # no reasoning block
        ("<think>x</think><action>move up</action><action>move down</action>", "move down", False),
        ("<think>x</think><action>move left", "move left", False),  # unclosed
        ("<think>x</think> move right", "move right", False),  # no tags
        ("", "", False),
        ("<action></action><think></think>", "", True),
        ("<THINK>x</THINK><ACTION>move up</ACTION>", "move up", True),
        ("<think><action>a</action>", "a", False),  # unclosed think
    ],
)
def test_parse_action_handles_malformed_text(text, action, well_formed):
    parsed = parse_action(text)
    assert parsed.action == action
    assert parsed.well_formed is well_formed


def test_expert_completion_round_trips():
    assert parse_action(expert_completion("move up")).action == "move up"
    assert parse_action(expert_completion("move up")).well_formed


def test_expert_completion_names_long_actions_by_verb_only():
    query = "search[i want a pair of seamless toe socks, color: pink, and size: medium]"
    short = expert_completion(query, think_limit=40)
    assert short == f"<think>next: search</think><action>{query}</action>"
    assert parse_action(short).action == query and parse_action(short).well_formed
    # Short actions, and every action without a limit, are named in full.
    assert expert_completion("click[buy now]", think_limit=40) == "<think>next: click[buy now]</think><action>click[buy now]</action>"
    assert query in expert_completion(query).split("</think>")[0]


def test_prompt_shows_task_recent_history_observation_and_actions():
    env = make_env("maze")
    obs, _ = env.reset(env.tasks()[0])
    history = [("obs A", "move up"), ("obs B", "move down"), ("obs C", "move left")]
    prompt = build_prompt(env, obs, history, history_length=2)
    assert "Reach the goal at position 8, 6." in prompt
    assert "obs A" not in prompt and "[2] observation: obs B action: move down" in prompt
    assert "[3] observation: obs C action: move left" in prompt
    assert "You have taken 3 step(s)" in prompt and f"Step 4. Observation: {obs}" in prompt
    assert "[move up, move down, move left, move right]" in prompt
    assert "<think>" in prompt and "<action>" in prompt
    assert "You have taken no step yet." in build_prompt(env, obs, [], 2)
    no_history = build_prompt(env, obs, history, history_length=0)
    assert "obs C" not in no_history and f"Current observation: {obs}" in no_history
    # Without history the prompt depends on the state alone, not on how many steps led there.
    assert no_history == build_prompt(env, obs, [], history_length=0)
    assert "step" not in no_history.lower()


def test_lenient_parsing_reads_what_chat_models_write_and_strict_does_not():
    from fedagent_flwr.agent.play.prompts import ParsedAction, parse_action

    for text in ("<action>move up</action>",  # no <think>
                 "Sure! <think>ok</think><action>`move up`</action>",  # the action quoted
                 "```xml\n<action>'move up'</action>\n```"):  # fenced and quoted, no <think>
        assert parse_action(text, "lenient") == ParsedAction("move up", True), text
        strict = parse_action(text, "strict")
        assert not (strict.well_formed and strict.action == "move up"), text  # strict takes none of them as is
    assert not parse_action("<action>a</action><action>b</action>", "lenient").well_formed  # two answers: still invalid
    assert not parse_action("I would go up", "lenient").well_formed  # prose: still invalid
    assert parse_action("<think>x</think><action>go</action>", "strict") == ParsedAction("go", True)


def test_prompt_roles_system_moves_the_standing_instructions_into_a_system_message(maze_tokenizer):
    from envs import make_env
    from fedagent_flwr.agent.play.prompts import ANSWER_FORMAT, build_prompt, system_prompt
    from fedagent_flwr.agent.play.rollout import (
        ExpertPolicy,
        PromptEncoder,
        RolloutConfig,
        run_episodes,
    )

    env = make_env("maze")
    obs, _ = env.reset(env.tasks()[0])
    user_only = build_prompt(env, obs, [], 0)
    split = build_prompt(env, obs, [], 0, roles="system")
    assert ANSWER_FORMAT in user_only and env.intro in user_only
    assert ANSWER_FORMAT not in split and env.intro not in split and "Admissible actions" in split
    assert system_prompt(env) == f"{env.intro} {ANSWER_FORMAT}"
    encoder = PromptEncoder(maze_tokenizer)
    ids = encoder(split, system_prompt(env))
    want = maze_tokenizer.apply_chat_template([{"role": "system", "content": system_prompt(env)},
                                               {"role": "user", "content": split}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
    assert ids == list(want)
    trajs = run_episodes(ExpertPolicy(maze_tokenizer), lambda: make_env("maze"), env.tasks()[:2], encoder,
                         RolloutConfig(history_length=0, prompt_roles="system"))
    first = trajs[0].steps[0]
    assert first.prompt == split and maze_tokenizer.decode(first.prompt_ids).count(ANSWER_FORMAT) == 1


@pytest.mark.parametrize(
    "text, tail, action, well_formed",
    [
        ("<think>go</think><action> Move Up </action>", 30, "move up", True),  # lowercased and stripped
        # the first action block, where strict takes the last and calls the answer malformed
        ("<think>x</think><action>go to desk 1</action><action>open drawer 2</action>", 30, "go to desk 1", True),
        ("<action>go</action><think>x</think>", 30, "go", True),  # the tags in any order
        ("<action>go</action>", 30, "go", False),  # no think tags
        ("<think>x<action>go</action>", 30, "go", False),  # an unclosed think
        ("<think>好</think><action>go</action>", 30, "go", False),  # a Chinese character
        # without both action tags: the last 30 (ALFWorld) or 20 (WebShop) characters, lowercased
        ("<think>x</think> I will Go To Cabinet 3 and then open it", 30, " to cabinet 3 and then open it", False),
        ("<think>x</think> I will click[Buy Now] now please", 20, "[buy now] now please", False),
        ("<think>x</think><action>take apple", 30, "nk>x</think><action>take apple", False),  # unclosed: no action read
    ],
)
def test_reference_parsing_reads_as_the_reference_projection_does(text, tail, action, well_formed):
    """verl-agent's alfworld/ and webshop/projection.py (the FedAgent reference), read by hand."""
    parsed = parse_action(text, "reference", tail)
    assert (parsed.action, parsed.well_formed) == (action, well_formed)


def test_the_reference_parser_takes_each_environments_tail():
    assert make_env("webshop").reference_tail_chars == 20
    assert make_env("alfworld").reference_tail_chars == 30 and make_env("gridworld").reference_tail_chars == 30
    both = make_env("gridworld,webshop")  # a multi-env spec answers for the environment of the episode it plays
    seen = set()
    for task in both.tasks()[:: max(1, len(both.tasks()) // 50)]:
        both.reset(task)
        seen.add((both.reference_tail_chars, both.reference_actions_per_line))
    assert seen == {(30, False), (20, True)}


def test_the_reference_template_carries_the_references_information_in_its_order_and_format():
    """verl-agent's ALFWorld and WebShop templates: task; then (from the second step, with history) the steps taken
    and the last rollout.history-length pairs as [Observation i: '...', Action i: '...']; the step and the observation;
    the quoted admissible actions ('help' left out); the answer format last."""
    env = make_env("alfworld")
    obs, _ = env.reset(env.tasks()[0])
    history = [("obs one", "go to desk 1"), ("obs two", "open drawer 1"), ("obs three", "look")]
    prompt = build_prompt(env, obs, history, 2, template="reference")
    task = env.instruction().removeprefix("Your task is to: ")
    order = [f"Your task is to: {task}", "taken 3 step(s)", "The most recent 2 ",
             "[Observation 2: 'obs two', Action 2: 'open drawer 1']\n[Observation 3: 'obs three', Action 3: 'look']",
             "step 4", obs, "admissible now are: ['go to ", "<think> </think>", "<action> </action>"]
    places = [prompt.find(part) for part in order]
    assert -1 not in places and places == sorted(places), list(zip(order, places))
    assert prompt.replace(obs, "").count("Your task is to:") == 1 and "'help'" not in prompt and "obs one" not in prompt
    assert "'\n '" in prompt  # ALFWorld's layout: quoted actions, one a line, the next line indented
    # the first step, and any step without history: no step counter, no history
    for first in (build_prompt(env, obs, [], 2, template="reference"), build_prompt(env, obs, history, 0, template="reference")):
        assert "step" not in first.split(obs)[0].lower().replace("step by step", "") and "Observation 1" not in first
    shop = make_env("webshop")
    shop_obs, _ = shop.reset(shop.tasks()[0])
    assert "are: [\n'search[<your query>]',\n]." in build_prompt(shop, shop_obs, [], 2, template="reference")  # WebShop's layout
    assert build_prompt(env, obs, history, 2) != prompt  # compact stays the default


@pytest.mark.parametrize("text,reading,action,well_formed", [
    # BabyAI / TextCraft: the first line after Action:, cleaned to letters, digits, commas and spaces
    ("Thought:\nthe key is left\n\nAction:\n  go to  red-key 1.\nmore", "line", "go to redkey 1", True),
    ("Thought:\nx\nAction: turn left\nAction: turn right", "line", "", False),  # two actions: AgentGym sends none
    ("I will turn left", "line", "", False),
    # WebShop: all after the last Action:, or the whole text when it holds search[ / click[ without the marker
    ("Thought:\nfind it\n\nAction:\nsearch[red shoes]", "last", "search[red shoes]", True),
    ("Action: click[a]\nAction: click[Buy Now]", "last", "click[Buy Now]", False),
    ("search[red shoes]", "last", "search[red shoes]", False),
    ("no marker here", "last", "", False),
    # Maze, Wordle and ours: between the first and any second Action:, or the whole text
    ("Thought:\nup is open\n\nAction:\nmove up", "first", "move up", True),
    ("Action: move up\nAction: move down", "first", "move up", False),
    ("  move left ", "first", "move left", False),
])
def test_agentgym_parsing_reads_as_agentgyms_clients_do(text, reading, action, well_formed):
    parsed = parse_action(text, "agentgym", agentgym_reading=reading)
    assert (parsed.action, parsed.well_formed) == (action, well_formed)


def test_the_agentgym_template_asks_for_thought_and_action_and_its_expert_answers_so():
    """rollout.prompt-template = agentgym: the introduction, the task, the answer form, the steps so far as Observation /
    Action pairs (rollout.history-length of them), the current observation and the actions; the expert's answer in that form
    is read back by each environment's AgentGym reading as the action it wrote."""
    env = make_env("maze")
    obs, _ = env.reset(env.tasks()[0])
    prompt = build_prompt(env, obs, [("o1", "move up"), ("o2", "move left")], 1, template="agentgym")
    assert prompt.startswith(env.intro) and "Thought:\n<your reasoning>\n\nAction:\n<one action>" in prompt
    assert "Observation:\no2\nAction:\nmove left" in prompt and "move up" not in prompt.split("Admissible")[0]
    assert prompt.split("\n\n")[-2] == f"Observation:\n{obs}" and "<think>" not in prompt
    for name in ("maze", "babyai", "textcraft", "wordle"):
        e = make_env(name)
        e.reset(e.tasks()[0])
        expert = e.expert_action()
        parsed = parse_action(expert_completion(expert, template="agentgym"), "agentgym", agentgym_reading=e.agentgym_reading)
        assert parsed.well_formed and e.is_admissible(parsed.action), (name, expert, parsed)
    assert expert_completion("move up", template="agentgym") == "Thought:\nnext: move up\n\nAction:\nmove up"
