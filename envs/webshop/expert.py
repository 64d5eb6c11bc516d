"""A scripted WebShop shopper with privileged access to the goal and the reward.

It acts from any page, so it can also take over a trajectory midway:
- search page: search the instruction without its price clause; if that search
  was already made this episode, search the target product's title;
- results: go (paging with next > / < prev) to the first product that can score
  1.0; if none of the results can, return to search while a query is left,
  otherwise go to the best-scoring product;
- item page of such a product: select the options of its purchase plan, then buy;
  any other item or sub-page: < prev.

A purchase plan picks, per option name, a value that goal.py counts as matched
(a value equal to a goal option first), and selects only as many as the score
needs to reach exactly 1.0 (goal.py counts every selected option, so selecting
more can push the score above 1, which is not a success).
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import Goal, Product
from .reward import attribute_matches, normalize_color, option_counts, purchase_reward, type_reward
from .site import (
    BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PAGE_ITEM, PAGE_RESULTS, PAGE_SEARCH, PREV_PAGE, PRODUCT_WINDOW, SUB_PAGES,
    Session, Site, clickable_key, option_clickables,
)

_PRICE_CLAUSE = ", and price lower than"


@dataclass(frozen=True)
class PurchasePlan:
    asin: str
    options: dict[str, str]
    score: float


def expert_queries(goal: Goal) -> list[str]:
    """The searches the expert tries, in order."""
    request = goal.instruction_text.split(_PRICE_CLAUSE)[0]
    primary = clickable_key(request) or clickable_key(goal.query)
    fallback = clickable_key(goal.name)
    return [primary] if fallback == primary or not fallback else [primary, fallback]


def plan_purchase(product: Product, goal: Goal, price: float) -> PurchasePlan:
    wanted_raw = goal.option_values
    wanted = [normalize_color(v) for v in wanted_raw]
    t = type_reward(product, goal)
    n_att = attribute_matches(product, goal.attributes)
    r_price = 1 if price <= goal.price_upper else 0
    needed = len(goal.attributes) + len(wanted_raw) + 1 - n_att - r_price
    # Which option a click on each value selects, as on the item page.
    selects = {key: name for key, (name, _) in option_clickables(product).items()}
    candidates = []
    for order, (name, values) in enumerate(product.options.items()):
        best: tuple[bool, str] | None = None
        for v in values:
            if selects.get(clickable_key(v)) != name or not option_counts(product, name, normalize_color(v), wanted):
                continue
            exact = v in wanted_raw
            if best is None or (exact and not best[0]):
                best = (exact, v)
            if exact:
                break
        if best is not None:
            candidates.append((not best[0], order, name, best[1]))
    chosen = sorted(candidates)[: max(0, needed)]
    options = {name: value for _, _, name, value in sorted(chosen, key=lambda c: c[1])}
    if t.r_type == 0:
        return PurchasePlan(product.asin, options, 0.0)
    return PurchasePlan(product.asin, options, purchase_reward(product, goal, price, options).score)


class ShoppingExpert:
    """Chooses the expert action for (goal, session); caches purchase plans per goal."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self._goal: Goal | None = None
        self._plans: dict[str, PurchasePlan] = {}

    def plan(self, goal: Goal, asin: str) -> PurchasePlan:
        if goal is not self._goal:
            self._goal, self._plans = goal, {}
        if asin not in self._plans:
            product = self.site.catalog.by_asin[asin]
            self._plans[asin] = plan_purchase(product, goal, self.site.catalog.prices[asin])
        return self._plans[asin]

    def _pick(self, goal: Goal, session: Session) -> int | None:
        """Index into session.results of the product to buy, or None to search again."""
        products = self.site.catalog.products
        best, best_score = None, -1.0
        for i, idx in enumerate(session.results):
            score = self.plan(goal, products[idx].asin).score
            if score == 1.0:
                return i
            if score > best_score:
                best, best_score = i, score
        if any(q not in session.queries for q in expert_queries(goal)):
            return None
        return best

    def action(self, goal: Goal, session: Session) -> str:
        page = session.page
        if page == PAGE_SEARCH:
            queries = expert_queries(goal)
            query = next((q for q in queries if q not in session.queries), queries[0])
            return f"search[{query}]"
        if page == PAGE_RESULTS:
            pick = self._pick(goal, session)
            if pick is None:
                return f"click[{BACK_TO_SEARCH}]"
            wanted_page = pick // PRODUCT_WINDOW + 1
            if wanted_page > session.page_no:
                return f"click[{NEXT_PAGE}]"
            if wanted_page < session.page_no:
                return f"click[{PREV_PAGE}]"
            return f"click[{clickable_key(self.site.catalog.products[session.results[pick]].asin)}]"
        if page == PAGE_ITEM:
            plan = self.plan(goal, session.asin)
            pick = self._pick(goal, session)
            chosen = pick is not None and self.site.catalog.products[session.results[pick]].asin == session.asin
            if plan.score != 1.0 and not chosen:
                return f"click[{PREV_PAGE}]"
            for name, value in plan.options.items():
                if session.options.get(name) != value:
                    return f"click[{clickable_key(value)}]"
            return f"click[{BUY_NOW}]"
        if page in SUB_PAGES:
            return f"click[{PREV_PAGE}]"
        raise RuntimeError(f"no expert action on the {page!r} page (the episode has ended)")
