"""WebShop's pages as a state machine, with their text rendering and clickables.

Pages and moves (as in WebShop's SimServer):

- search page: `search[query]` runs a search and opens the results at page 1;
- results (10 per page): `back to search`, `< prev` (page > 1), `next >` (more
  results), or a product id (lower-cased ASIN), which opens its item page;
- item page: an option value selects it (one value per option name), `description`,
  `features`, `reviews` open sub-pages, `< prev` returns to the results page it came
  from, `buy now` ends the episode;
- sub-pages: `< prev` returns to the item page (selected options kept);
- `back to search` from any page starts over on the search page.

A page's text is its visible strings joined with ' [SEP] ', as in WebShop's simple
text mode (e.g. "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP]
B0... [SEP] title [SEP] $12.99"). The instruction header WebShop repeats on every
page is optional: the agent's prompt already carries the instruction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import Catalog, Product
from .search import SEARCH_RETURN_N, SearchEngine

PRODUCT_WINDOW = 10
SEP = " [SEP] "

PAGE_SEARCH, PAGE_RESULTS, PAGE_ITEM, PAGE_DONE = "search", "results", "item", "done"
SUB_PAGES = ("description", "features", "reviews")

BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "back to search", "next >", "< prev", "buy now"
ITEM_BUTTONS = (BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, BUY_NOW)


def clickable_key(text: str) -> str:
    """How a clickable is named in actions: lower-cased, whitespace collapsed (as the env normalises actions)."""
    return " ".join(text.lower().split())


def option_clickables(product: Product) -> dict[str, tuple[str, str]]:
    """Clickable name -> (option name, value) for a product's options.

    A value listed under several option names selects the last one (WebShop's
    clickable table keeps the last radio button); a value named like a button is
    left to the button.
    """
    out: dict[str, tuple[str, str]] = {}
    for name, values in product.options.items():
        for value in values:
            key = clickable_key(value)
            if key and key not in ITEM_BUTTONS:
                out[key] = (name, value)
    return out


@dataclass
class Session:
    """Everything that changes while browsing; an invalid action leaves it untouched."""

    page: str = PAGE_SEARCH
    keywords: str | None = None
    results: tuple[int, ...] = ()
    page_no: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    queries: tuple[str, ...] = ()  # every search of the episode, in order


@dataclass(frozen=True)
class Clickable:
    kind: str  # "button", "product" or "option"
    target: str  # button name, product asin, or option name
    value: str = ""  # the option value, for options


class Site:
    """Pages over one catalog; the session object carries the browsing state."""

    def __init__(self, catalog: Catalog, engine: SearchEngine | None = None) -> None:
        self.catalog = catalog
        self.engine = engine or SearchEngine(catalog.products)

    # ----- state queries ---------------------------------------------------------------
    def product(self, session: Session) -> Product:
        if session.asin is None:
            raise RuntimeError("no product is open")
        return self.catalog.by_asin[session.asin]

    def page_products(self, session: Session) -> list[Product]:
        start = (session.page_no - 1) * PRODUCT_WINDOW
        return [self.catalog.products[i] for i in session.results[start : start + PRODUCT_WINDOW]]

    def clickables(self, session: Session) -> dict[str, Clickable]:
        page = session.page
        out: dict[str, Clickable] = {}
        if page == PAGE_RESULTS:
            out[BACK_TO_SEARCH] = Clickable("button", BACK_TO_SEARCH)
            if session.page_no > 1:
                out[PREV_PAGE] = Clickable("button", PREV_PAGE)
            if session.page_no * PRODUCT_WINDOW < len(session.results):
                out[NEXT_PAGE] = Clickable("button", NEXT_PAGE)
            for p in self.page_products(session):
                out[clickable_key(p.asin)] = Clickable("product", p.asin)
        elif page == PAGE_ITEM:
            for name in ITEM_BUTTONS:
                out[name] = Clickable("button", name)
            for key, (name, value) in option_clickables(self.product(session)).items():
                out[key] = Clickable("option", name, value)
        elif page in SUB_PAGES:
            out[BACK_TO_SEARCH] = Clickable("button", BACK_TO_SEARCH)
            out[PREV_PAGE] = Clickable("button", PREV_PAGE)
        return out

    # ----- moves -------------------------------------------------------------------------
    def search(self, session: Session, query: str) -> None:
        session.page = PAGE_RESULTS
        session.keywords = query
        session.results = tuple(self.engine.search(query, SEARCH_RETURN_N))
        session.page_no = 1
        session.asin = None
        session.options = {}
        session.queries = (*session.queries, query)

    def click(self, session: Session, clickable: Clickable) -> None:
        """Apply any click but `buy now` (the environment scores purchases)."""
        if clickable.kind == "product":
            session.page = PAGE_ITEM
            session.asin = clickable.target
            session.options = {}
            return
        if clickable.kind == "option":
            session.options[clickable.target] = clickable.value
            return
        name = clickable.target
        if name == BACK_TO_SEARCH:
            session.page = PAGE_SEARCH
            session.keywords = None
            session.results = ()
            session.page_no = 1
            session.asin = None
            session.options = {}
        elif name == NEXT_PAGE:
            session.page_no += 1
        elif name == PREV_PAGE:
            if session.page == PAGE_RESULTS:
                session.page_no -= 1
            elif session.page == PAGE_ITEM:
                # Back on the results page the selection is cleared, as a fresh results page does.
                session.page = PAGE_RESULTS
                session.asin = None
                session.options = {}
            else:
                session.page = PAGE_ITEM
        elif name in SUB_PAGES:
            session.page = name
        else:
            raise ValueError(f"unknown button {name!r}")

    # ----- rendering ----------------------------------------------------------------------
    def render(self, session: Session, instruction: str | None = None, score: float | None = None) -> str:
        page = session.page
        header = ["Instruction:", instruction] if instruction else []
        if page == PAGE_SEARCH:
            parts = ["WebShop", *header, "Search"]
        elif page == PAGE_RESULTS:
            parts = [*header, "Back to Search", f"Page {session.page_no} (Total results: {len(session.results)})"]
            if session.page_no > 1:
                parts.append("< Prev")
            if session.page_no * PRODUCT_WINDOW < len(session.results):
                parts.append("Next >")
            for p in self.page_products(session):
                parts += [p.asin, p.title, p.price_tag]
        elif page == PAGE_ITEM:
            p = self.product(session)
            parts = [*header, "Back to Search", "< Prev"]
            for name, values in p.options.items():
                parts += [name, *values]
            parts += [p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}", "Description", "Features", "Reviews", "Buy Now"]
        elif page in SUB_PAGES:
            p = self.product(session)
            parts = [*header, "Back to Search", "< Prev"]
            if page == "description":
                parts.append(p.description)
            elif page == "features":
                parts += list(p.bullet_points)
            elif p.reviews:
                for r in p.reviews:
                    parts += [f'"{r.title}"', str(r.score), r.body]
            else:
                parts.append("No reviews found")
        elif page == PAGE_DONE:
            parts = ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{score}"]
        else:
            raise ValueError(f"unknown page {page!r}")
        return SEP.join(s.strip() for s in parts if s and s.strip())
