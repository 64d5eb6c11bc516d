"""The WebShop data model: products, goals, and the catalog that holds both.

Field meanings follow WebShop's engine after `load_products` has cleaned a raw
item: the title is the raw `name`, option names and values are lower-cased with
'/' written as ' | ', `pricing` is one price or a [low, high] range, and the
price a purchase is judged on is drawn once per product (uniformly inside the
range). A goal carries what goal.py's reward reads: the target's query, name and
category path, the attributes and options asked for, and the price upper bound.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from ..base import SPLITS

# WebShop's price grid for goal upper bounds: 10, 20, ..., 990 dollars.
PRICE_GRID = tuple(10.0 * i for i in range(1, 100))
# Upper bound used when the product costs too much for the grid (no price clause then).
NO_PRICE_LIMIT = 1_000_000.0
DEFAULT_PRICE = 100.0


@dataclass(frozen=True)
class Review:
    title: str
    score: int
    body: str


@dataclass(frozen=True, eq=False)
class Product:
    asin: str
    title: str
    category: str
    query: str
    product_category: str
    options: dict[str, tuple[str, ...]]
    pricing: tuple[float, ...]
    attributes: tuple[str, ...]
    bullet_points: tuple[str, ...]
    description: str
    reviews: tuple[Review, ...] = ()
    rating: str = "N.A."

    def __post_init__(self) -> None:
        if not self.asin:
            raise ValueError("Product: asin must be a non-empty string")
        if len(self.pricing) > 2:
            raise ValueError(f"Product {self.asin}: pricing holds one price or a [low, high] range, got {self.pricing}")

    @property
    def price_tag(self) -> str:
        """The price as WebShop prints it: '$12.99' or '$10.0 to $20.0' (Python float repr)."""
        if not self.pricing:
            return f"${DEFAULT_PRICE}"
        if len(self.pricing) == 1:
            return f"${self.pricing[0]}"
        return f"${self.pricing[0]} to ${self.pricing[1]}"

    # Lower-cased texts goal.py searches for attributes and option values.
    @cached_property
    def title_lower(self) -> str:
        return self.title.lower()

    @cached_property
    def bullets_lower(self) -> str:
        return " ".join(self.bullet_points).lower()

    @cached_property
    def description_lower(self) -> str:
        return self.description.lower()

    def mentions(self, text: str) -> bool:
        """Whether `text` occurs in the title, the bullet points or the description (each lower-cased)."""
        return text in self.title_lower or text in self.bullets_lower or text in self.description_lower

    def search_document(self) -> str:
        """The text WebShop indexes: title, description, first bullet point and the option list."""
        option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, option_text]).lower()


@dataclass(frozen=True, eq=False)
class Goal:
    asin: str
    category: str
    query: str
    name: str
    product_category: str
    instruction_text: str
    attributes: tuple[str, ...]
    price_upper: float
    # A dict {option name: value} for goals built from option combinations, a plain
    # list of values for human instructions (WebShop keeps both forms).
    goal_options: dict[str, str] | tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # goal.py divides by the number of goal attributes; WebShop skips goals without any.
        if not self.attributes:
            raise ValueError(f"Goal for {self.asin}: at least one attribute is required")

    @property
    def option_values(self) -> list[str]:
        if isinstance(self.goal_options, dict):
            return list(self.goal_options.values())
        return list(self.goal_options)


def sample_price(pricing: Sequence[float], rng: random.Random) -> float:
    """The price a purchase is judged on: the single price, or uniform inside [low, high]."""
    if not pricing:
        return DEFAULT_PRICE
    if len(pricing) == 1:
        return float(pricing[0])
    return rng.uniform(pricing[0], pricing[1])


def price_upper_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """WebShop's goal price rule: of the first four grid prices above `price`, draw two
    and keep the larger; returns (upper bound, instruction suffix)."""
    above = [p for p in PRICE_GRID if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_LIMIT, ""
    upper = max(rng.sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def option_text(goal_options: dict[str, str]) -> str:
    """The ' with size: m, and color: red' clause WebShop appends for option-combination goals."""
    if not goal_options:
        return ""
    return " with " + ", and ".join(f"{k}: {v}" for k, v in goal_options.items())


@dataclass(eq=False)
class Catalog:
    """Products, goals (in task order), each goal's split, and every product's judged price."""

    products: list[Product]
    goals: list[Goal]
    splits: list[str]
    prices: dict[str, float]
    source: str = "synthetic"
    by_asin: dict[str, Product] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.products:
            raise ValueError("Catalog: no products")
        if not self.goals:
            raise ValueError("Catalog: no goals")
        if len(self.splits) != len(self.goals):
            raise ValueError(f"Catalog: {len(self.splits)} splits for {len(self.goals)} goals")
        bad = sorted(set(self.splits) - set(SPLITS))
        if bad:
            raise ValueError(f"Catalog: splits must be in {SPLITS}, got {bad}")
        self.by_asin = {}
        for p in self.products:
            if p.asin in self.by_asin:
                raise ValueError(f"Catalog: duplicate asin {p.asin}")
            self.by_asin[p.asin] = p
        missing = sorted({g.asin for g in self.goals} - set(self.by_asin))
        if missing:
            raise ValueError(f"Catalog: goals name products that are not in the catalog: {missing[:5]}")
        missing_prices = [p.asin for p in self.products if p.asin not in self.prices]
        if missing_prices:
            raise ValueError(f"Catalog: no judged price for {missing_prices[:5]}")
