"""WebShop's purchase reward (web_agent_site/engine/goal.py), rule for rule.

    score = r_type * (matched attributes + matched options + r_price)
                   / (goal attributes + goal options + 1)

- r_type: 1.0, lowered to 0.5 unless the queries match, at least two category
  levels (split on '›') are shared, or the noun overlap title_score exceeds 0.2;
  0.1 if title_score < 0.1; 0.0 if title_score == 0. title_score = shared nouns
  of the two names / noun tokens of the goal name (0.2 when the goal name has
  none). Nouns come from `nouns.noun_tokens`, a heuristic stand-in for spaCy.
- attributes: a goal attribute matches if token_set_ratio with some product
  attribute exceeds 85, else if it is a substring of the lower-cased title,
  bullet points or description.
- options: both sides pass through `normalize_color`; every purchased option
  counts once: an option named 'size' only on exact equality with a goal option,
  any other when token_set_ratio with some goal option exceeds 85; failing that,
  when its value is a substring of the title, bullet points or description.
  (So purchased options can outnumber goal options and push the score above 1,
  as in the reference.)
- r_price: 1 if the judged price is at most the goal's upper bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from thefuzz import fuzz

from .catalog import Goal, Product
from .nouns import noun_tokens

EXACT_MATCH_OPTIONS = ("size",)
FUZZY_THRESHOLD = 85

# WebShop's colour vocabulary (engine/normalize.py), in its order: the first entry
# that occurs inside a value replaces the whole value.
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue",
    "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral",
    "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia",
    "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime", "magenta",
    "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom", "mustard",
    "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple",
    "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise",
    "violet", "walnut", "wheat", "white", "wine", "yellow",
)


def normalize_color(value: str) -> str:
    """The first colour of COLOR_SET found inside `value`, else `value` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


@dataclass(frozen=True)
class TypeReward:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


@dataclass(frozen=True)
class RewardBreakdown:
    score: float
    r_type: float
    r_att: float
    r_option: float | None  # None when the goal names no option
    r_price: float
    n_attributes: int
    n_options: int
    query_match: bool
    category_match: bool
    title_score: float


def _category_levels(path: str) -> set[str]:
    return {level.strip() for level in path.split("›")}


def type_reward(product: Product, goal: Goal) -> TypeReward:
    query_match = product.query == goal.query
    category_match = len(_category_levels(product.product_category) & _category_levels(goal.product_category)) >= 2
    purchased = noun_tokens(product.title)
    desired = noun_tokens(goal.name)
    if desired:
        title_score = len(set(purchased) & set(desired)) / len(desired)
    else:
        title_score = 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(product: Product, goal_attributes: Sequence[str]) -> int:
    matched = 0
    for wanted in goal_attributes:
        if any(fuzz.token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.attributes):
            matched += 1
        elif product.mentions(wanted):
            matched += 1
    return matched


def option_counts(product: Product, name: str, value: str, goal_values_normalized: Sequence[str]) -> bool:
    """Whether one purchased option (already colour-normalised) counts as matched."""
    if name.lower() in EXACT_MATCH_OPTIONS:
        if value in goal_values_normalized:
            return True
    elif any(fuzz.token_set_ratio(wanted, value) > FUZZY_THRESHOLD for wanted in goal_values_normalized):
        return True
    return product.mentions(value)


def option_matches(product: Product, goal_values: Sequence[str], purchased: Mapping[str, str]) -> int:
    wanted = [normalize_color(v) for v in goal_values]
    return sum(option_counts(product, name, normalize_color(value), wanted) for name, value in purchased.items())


def purchase_reward(product: Product, goal: Goal, price: float, options: Mapping[str, str]) -> RewardBreakdown:
    """The reference score of buying `product` at `price` with `options` selected, with its parts."""
    t = type_reward(product, goal)
    r_price = 1.0 if price <= goal.price_upper else 0.0
    n_att = attribute_matches(product, goal.attributes)
    goal_values = goal.option_values
    n_opt = option_matches(product, goal_values, options)
    denominator = len(goal.attributes) + len(goal_values) + 1
    # Same operation order as the reference, so a full match is exactly 1.0.
    score = (n_att + n_opt + r_price) / denominator
    score *= t.r_type
    return RewardBreakdown(
        score=score,
        r_type=t.r_type,
        r_att=n_att / len(goal.attributes) if goal.attributes else 0.0,
        r_option=n_opt / len(goal_values) if goal_values else None,
        r_price=r_price,
        n_attributes=n_att,
        n_options=n_opt,
        query_match=t.query_match,
        category_match=t.category_match,
        title_score=t.title_score,
    )
