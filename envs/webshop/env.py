"""WebShop's text mode as a TextEnv.

Tasks are WebShop goals (category = the product's top-level category). An episode
starts on the search page; `search[query]` and `click[name]` move through the
pages (see site.py); `click[buy now]` ends the episode and scores the purchase
with goal.py's rule (reward.py). As in the FedAgent reference, the step reward is
10 when that score is exactly 1.0 and 0 otherwise (`rollout.reward="score"` gives the raw
score instead); the raw score is kept as `task_score` and in `info["score"]`.

Two uses of the TextEnv hooks:
- a purchase ends the episode even when it is not a success (`is_terminal`);
- `search[<anything>]` is admissible on the search page but cannot be listed, so
  `admissible_actions()` lists the clickables plus the template
  "search[<your query>]" (as verl-agent lists WebShop's actions) and
  `is_admissible` decides. `action_hint()` describes the syntax in one line.

Differences from WebShop's own text env, all for consistency between what is listed
and what is accepted: search is accepted on the search page only (WebShop runs it
from any page although only the search page has a search bar), the no-op
`click[search]` is not listed, and an unknown action returns an
"Invalid action." observation instead of repeating the page.
"""

from __future__ import annotations

import copy
import os
import re
from functools import lru_cache
from typing import Any

from ..base import Task, TextEnv
from .catalog import Catalog, Goal
from .expert import ShoppingExpert
from .loader import REFERENCE_GOAL_SEED, REFERENCE_TEST_SIZE, load_webshop
from .reward import RewardBreakdown, purchase_reward
from .site import BUY_NOW, PAGE_DONE, PAGE_SEARCH, Clickable, Session, Site
from .synthetic import DEFAULT_N_GOALS, DEFAULT_N_PRODUCTS, DEFAULT_TEST_SIZE, generate_catalog

DATA_ENV_VAR = "WEBSHOP_DATA"
SEARCH_TEMPLATE = "search[<your query>]"
SUCCESS_REWARD = 10.0
REWARD_MODES = ("success", "score")
_ACTION_RE = re.compile(r"(search|click)\[(.+)\]", re.DOTALL)


@lru_cache(maxsize=4)
def _catalog_site(catalog: Catalog) -> Site:
    return Site(catalog)


@lru_cache(maxsize=4)
def _synthetic_site(seed: int, n_products: int, n_goals: int, test_size: int) -> Site:
    # Catalog and index are read-only once built, so environments in one process share them.
    return Site(generate_catalog(seed, n_products, n_goals, test_size))


@lru_cache(maxsize=2)
def _real_site(path: str, num_products: int | None, human_goals: bool | None, seed: int, goal_seed: int, test_size: int) -> Site:
    catalog = load_webshop(
        path, num_products=num_products, human_goals=human_goals, seed=seed, goal_seed=goal_seed, test_size=test_size
    )
    return Site(catalog)


@lru_cache(maxsize=8)
def _task_pool(site: Site) -> tuple[Task, ...]:
    # Rollouts build one environment per episode; the pool of a shared catalog is built once.
    catalog = site.catalog
    return tuple(
        Task(id=f"webshop-{i}", category=g.category, split=split, data={"goal": i, "asin": g.asin})
        for i, (g, split) in enumerate(zip(catalog.goals, catalog.splits))
    )


class WebShopEnv(TextEnv):
    name = "webshop"
    intro = "You are shopping online on WebShop. Find and buy the product that best matches the instruction."
    default_max_steps = 15
    reference_tail_chars = 20  # verl-agent's webshop/projection.py
    agentgym_reading = "last"  # AgentGym's WebShop client
    reference_actions_per_line = True  # verl-agent's prompts/webshop.py
    default_max_new_tokens = 128  # a search query appears in both <think> and <action>

    def __init__(
        self,
        max_steps: int | None = None,
        *,
        catalog: Catalog | None = None,
        data: str | os.PathLike | None = None,
        seed: int = 0,
        n_products: int = DEFAULT_N_PRODUCTS,
        n_goals: int = DEFAULT_N_GOALS,
        test_size: int | None = None,
        num_products: int | None = None,
        human_goals: bool | None = None,
        goal_seed: int = REFERENCE_GOAL_SEED,
        reward: str = "success",
        show_instruction: bool = False,
    ) -> None:
        """The catalog comes from `catalog`, else the WebShop files at `data` (or $WEBSHOP_DATA),
        else the synthetic generator (`seed`, `n_products`, `n_goals`, `test_size`)."""
        super().__init__(max_steps)
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        self.reward_mode = reward
        self.show_instruction = bool(show_instruction)
        data = data if data is not None else os.environ.get(DATA_ENV_VAR) or None
        if catalog is not None:
            self.site = _catalog_site(catalog)
        elif data is not None:
            size = REFERENCE_TEST_SIZE if test_size is None else test_size
            self.site = _real_site(str(data), num_products, human_goals, seed, goal_seed, size)
        else:
            size = DEFAULT_TEST_SIZE if test_size is None else test_size
            self.site = _synthetic_site(seed, n_products, n_goals, size)
        self.catalog = self.site.catalog
        self.expert = ShoppingExpert(self.site)
        self._tasks = _task_pool(self.site)
        self.goal: Goal | None = None
        self.session = Session()
        self._clickables: dict[str, Clickable] = {}
        self.purchased = False
        self.task_score = 0.0
        self.last_reward_breakdown: RewardBreakdown | None = None

    # ----- task pool -------------------------------------------------------------------
    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def instruction(self) -> str:
        if self.goal is None:
            raise RuntimeError("WebShopEnv.instruction() called before reset()")
        return self.goal.instruction_text

    # ----- actions ----------------------------------------------------------------------
    def admissible_actions(self) -> list[str]:
        actions = [SEARCH_TEMPLATE] if self.session.page == PAGE_SEARCH else []
        return actions + [f"click[{key}]" for key in self._clickables]

    def action_hint(self) -> str:
        if self.session.page == PAGE_SEARCH:
            return "search[<your query>], with any keywords as the query"
        return "click[<name>], with <name> a listed button, product id or option value, lower-cased"

    def is_admissible(self, action: str) -> bool:
        """Whether a (normalised) action is accepted in the current state."""
        m = _ACTION_RE.fullmatch(action)
        if m is None:
            return False
        verb, arg = m.groups()
        if verb == "search":
            return self.session.page == PAGE_SEARCH and bool(arg.strip())
        return arg in self._clickables

    def expert_action(self) -> str:
        if self.goal is None:
            raise RuntimeError("WebShopEnv.expert_action() called before reset()")
        if self.done:
            raise RuntimeError("WebShopEnv.expert_action() called after the episode ended")
        return self.expert.action(self.goal, self.session)

    # ----- episode ------------------------------------------------------------------------
    def is_terminal(self) -> bool:
        # A purchase ends the episode whether or not it was the right product.
        return self.won or self.purchased

    def _info(self, valid: bool) -> dict[str, Any]:
        info = super()._info(valid)
        info["score"] = self.task_score
        return info

    def observation(self) -> str:
        instruction = self.goal.instruction_text if (self.show_instruction and self.goal is not None) else None
        return self.site.render(self.session, instruction, self.task_score)

    def _reset(self, task: Task) -> str:
        index = task.data.get("goal")
        if not isinstance(index, int) or not 0 <= index < len(self.catalog.goals):
            raise ValueError(
                f"WebShop task {task.id!r}: data['goal'] must be a goal index in [0, {len(self.catalog.goals)}), got {index!r}"
            )
        self.goal = self.catalog.goals[index]
        self.session = Session()
        self._clickables = self.site.clickables(self.session)
        self.purchased = False
        self.task_score = 0.0
        self.last_reward_breakdown = None
        return self.observation()

    def _step(self, action: str) -> tuple[str, float]:
        verb, arg = _ACTION_RE.fullmatch(action).groups()
        reward = 0.0
        if verb == "search":
            self.site.search(self.session, arg)
        elif arg == BUY_NOW:
            reward = self._purchase()
        else:
            self.site.click(self.session, self._clickables[arg])
        self._clickables = {} if self.purchased else self.site.clickables(self.session)
        return self.observation(), reward

    def _purchase(self) -> float:
        product = self.site.product(self.session)
        breakdown = purchase_reward(product, self.goal, self.catalog.prices[product.asin], self.session.options)
        self.last_reward_breakdown = breakdown
        self.task_score = breakdown.score
        self.purchased = True
        self.won = breakdown.score == 1.0
        self.session.page = PAGE_DONE
        if self.reward_mode == "score":
            return breakdown.score
        return SUCCESS_REWARD if self.won else 0.0

    def _invalid(self, action: str) -> tuple[str, float]:
        return f"Invalid action. {self.observation()}", 0.0

    def snapshot(self) -> Session:
        """A copy of the browsing state (for tests and debugging)."""
        return copy.deepcopy(self.session)
