"""Loading the real WebShop data files into a Catalog.

Files (as distributed by princeton-nlp/WebShop, setup.sh):
- items_shuffle*.json: a list of scraped products (asin, name, category, query,
  product_category, full_description, small_description, pricing, images,
  customization_options {name: [{value, image}]}, ...);
- items_ins_v2*.json: {asin: {attributes, instruction, instruction_attributes}};
- items_human_ins.json: {asin: [{instruction, instruction_attributes,
  instruction_options, ...}]} (human goals; without it goals are synthetic);
- reviews.json (optional): [{asin, reviews, average_rating}].

Cleaning follows engine.py's `load_products`: products with asin 'nan' or longer
than 10 characters and repeated asins are dropped; option names and values are
lower-cased, '/' in values becomes ' | '; a pricing string "$a - $b" gives [a, b]
(missing pricing means $100.0); products without attributes get ['DUMMY_ATTR'].
Goals follow goal.py: one per human instruction with attributes, or one per
option combination of every product with a synthetic instruction; then WebShop's
shuffle (random.seed(goal_seed); random.shuffle) and the first `test_size` goals
form the test split (the reference validates on goals 0-499). Judged prices and
price bounds are drawn from `random.Random(seed)` (WebShop draws them unseeded).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from .catalog import Catalog, Goal, Product, Review, option_text, price_upper_bound, sample_price

PRODUCTS_GLOB = "items_shuffle*.json"
HUMAN_FILE = "items_human_ins.json"
REVIEWS_FILE = "reviews.json"
REFERENCE_GOAL_SEED = 233  # WebShop's fixed goal shuffle
REFERENCE_TEST_SIZE = 500
_REQUIRED_KEYS = ("asin", "name", "category", "query", "product_category")


def find_webshop_files(path: str | Path) -> dict[str, Path | None]:
    """Resolve the data files from a directory or from an items_shuffle*.json path.

    Beside items_shuffle<suffix>.json the loader uses items_ins_v2<suffix>.json,
    items_human_ins.json and reviews.json when they exist.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        found = sorted(path.glob(PRODUCTS_GLOB))
        if not found:
            raise ValueError(f"no {PRODUCTS_GLOB} in {path}; point to WebShop's data directory or a products file")
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise ValueError(f"several product files in {path} ({names}); point to the one to use")
        products = found[0]
    elif path.is_file():
        if not re.fullmatch(r"items_shuffle.*\.json", path.name):
            raise ValueError(f"expected a file named {PRODUCTS_GLOB}, got {path.name}")
        products = path
    else:
        raise ValueError(f"WebShop data path does not exist: {path}")
    suffix = products.name[len("items_shuffle") : -len(".json")]
    folder = products.parent

    def optional(name: str) -> Path | None:
        candidate = folder / name
        return candidate if candidate.is_file() else None

    return {
        "products": products,
        "attributes": optional(f"items_ins_v2{suffix}.json"),
        "human": optional(HUMAN_FILE),
        "reviews": optional(REVIEWS_FILE),
    }


def _read_json(path: Path, kind: type) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, kind):
        raise ValueError(f"{path} must hold a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def parse_pricing(pricing: Any) -> tuple[float, ...]:
    """'$12.99' -> (12.99,); '$10.99 - $13.49' -> (10.99, 13.49); missing -> (100.0,)."""
    if isinstance(pricing, (int, float)):
        return (float(pricing),)
    if isinstance(pricing, list):  # already parsed (WebShop's cleaned product files)
        values = [float(Decimal(re.sub(r"[^\d.]", "", str(p)))) for p in pricing if re.sub(r"[^\d.]", "", str(p))]
    elif isinstance(pricing, str) and pricing:
        values = []
        for part in pricing.split("$")[1:]:
            digits = re.sub(r"[^\d.]", "", part)
            try:
                values.append(float(Decimal(digits)))
            except InvalidOperation:
                continue
    else:
        values = []
    return tuple(values[:2]) if values else (100.0,)


def _options(raw: Any) -> dict[str, tuple[str, ...]]:
    options: dict[str, tuple[str, ...]] = {}
    if not raw:
        return options
    for name, contents in raw.items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"] if isinstance(content, dict) else str(content)
            values.append(value.strip().replace("/", " | ").lower())
        options[name.lower()] = tuple(values)
    return options


def _reviews(raw: list[dict]) -> tuple[Review, ...]:
    out = []
    for r in raw or []:
        score = r.get("score", r.get("stars", 0))
        try:
            score = int(float(score))
        except (TypeError, ValueError):
            score = 0
        out.append(Review(str(r.get("title", "")), score, str(r.get("body", r.get("review", "")))))
    return tuple(out)


def load_webshop(
    path: str | Path,
    *,
    num_products: int | None = None,
    human_goals: bool | None = None,
    seed: int = 0,
    goal_seed: int = REFERENCE_GOAL_SEED,
    test_size: int = REFERENCE_TEST_SIZE,
) -> Catalog:
    """A Catalog from WebShop's files; `human_goals=None` uses human goals when their file exists."""
    files = find_webshop_files(path)
    if num_products is not None and num_products <= 0:
        raise ValueError(f"num_products must be positive or None, got {num_products}")
    if test_size < 0:
        raise ValueError(f"test_size must be >= 0, got {test_size}")
    if human_goals is None:
        human_goals = files["human"] is not None
    if human_goals and files["human"] is None:
        raise ValueError(f"human goals need {HUMAN_FILE} beside {files['products'].name}")
    if not human_goals and files["attributes"] is None:
        raise ValueError(f"synthetic goals need items_ins_v2*.json beside {files['products'].name}")

    raw_products = _read_json(files["products"], list)
    if num_products is not None:
        raw_products = raw_products[:num_products]  # the product file is already shuffled
    attributes = _read_json(files["attributes"], dict) if files["attributes"] else {}
    human = _read_json(files["human"], dict) if human_goals else {}
    reviews: dict[str, tuple[list, Any]] = {}
    if files["reviews"]:
        for r in _read_json(files["reviews"], list):
            reviews[r["asin"]] = (r.get("reviews", []), r.get("average_rating", "N.A."))

    products: list[Product] = []
    instructions: dict[str, Any] = {}
    seen: set[str] = set()
    for i, raw in enumerate(raw_products):
        if not isinstance(raw, dict):
            raise ValueError(f"{files['products'].name}: item {i} is not an object")
        missing = [k for k in _REQUIRED_KEYS if k not in raw]
        if missing:
            raise ValueError(f"{files['products'].name}: item {i} ({raw.get('asin')!r}) lacks {missing}")
        asin = str(raw["asin"])
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        bullets = raw.get("small_description") or []
        bullets = [str(b) for b in bullets] if isinstance(bullets, list) else [str(bullets)]
        item_reviews, rating = reviews.get(asin, ([], "N.A."))
        attrs = attributes.get(asin, {})
        if not isinstance(attrs, dict):
            raise ValueError(f"{files['attributes'].name}: entry {asin} must be an object, got {type(attrs).__name__}")
        if human_goals and not isinstance(human.get(asin, []), list):
            raise ValueError(f"{HUMAN_FILE}: entry {asin} must be a list of instructions")
        products.append(
            Product(
                asin=asin,
                title=str(raw["name"]),
                category=str(raw["category"]),
                query=str(raw["query"]).lower().strip(),
                product_category=str(raw["product_category"]),
                options=_options(raw.get("customization_options")),
                pricing=parse_pricing(raw.get("pricing")),
                attributes=tuple(attrs["attributes"] if "attributes" in attrs else ["DUMMY_ATTR"]),
                bullet_points=tuple(bullets),
                description=str(raw.get("full_description") or ""),
                reviews=_reviews(item_reviews),
                rating=str(rating),
            )
        )
        instructions[asin] = human.get(asin) if human_goals else attrs

    rng = random.Random(seed)
    prices = {p.asin: sample_price(p.pricing, rng) for p in products}
    goals = _human_goals(products, instructions, prices, rng) if human_goals else _synthetic_goals(products, instructions, prices, rng)
    if not goals:
        raise ValueError(f"no goals could be built from {files['products'].parent}")
    random.Random(goal_seed).shuffle(goals)
    splits = ["test" if i < test_size else "train" for i in range(len(goals))]
    return Catalog(products, goals, splits, prices, source=f"webshop({files['products']})")


def _human_goals(products: list[Product], instructions: dict, prices: dict, rng: random.Random) -> list[Goal]:
    goals = []
    for p in products:
        for ins in instructions.get(p.asin) or []:
            attrs = ins.get("instruction_attributes") or []
            if not attrs:
                continue  # WebShop skips instructions without attributes
            price_upper, price_text = price_upper_bound(prices[p.asin], rng)
            goals.append(
                Goal(
                    asin=p.asin,
                    category=p.category,
                    query=p.query,
                    name=p.title,
                    product_category=p.product_category,
                    instruction_text=str(ins["instruction"]).strip(".") + price_text,
                    attributes=tuple(attrs),
                    price_upper=price_upper,
                    goal_options=tuple(ins.get("instruction_options") or ()),
                )
            )
    return goals


def _synthetic_goals(products: list[Product], instructions: dict, prices: dict, rng: random.Random) -> list[Goal]:
    goals = []
    for p in products:
        entry = instructions.get(p.asin) or {}
        if entry.get("instruction") is None or not entry.get("instruction_attributes"):
            continue
        price_upper, price_text = price_upper_bound(prices[p.asin], rng)
        names = sorted(p.options)
        for combination in itertools.product(*(p.options[n] for n in names)):
            goal_options = dict(zip(names, combination))
            goals.append(
                Goal(
                    asin=p.asin,
                    category=p.category,
                    query=p.query,
                    name=p.title,
                    product_category=p.product_category,
                    instruction_text=f"{entry['instruction']}{option_text(goal_options)}{price_text}",
                    attributes=tuple(entry["instruction_attributes"]),
                    price_upper=price_upper,
                    goal_options=goal_options,
                )
            )
    return goals
