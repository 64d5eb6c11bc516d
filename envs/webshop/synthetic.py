"""A seeded synthetic WebShop catalog: the default when no real WebShop files are given.

Thirty product types in WebShop's five categories (beauty, electronics, fashion,
food, furniture) each come with an Amazon-style category path, a search query, a
pool of attribute phrases, option lists and a price range. Every product draws a
brand, 2-5 attributes, a proper subset of each option list and a log-uniform price
(a quarter of them shown as a price range, as on WebShop's pages); its title names
two attributes, its bullet points and description mention all of them and none of
its option values, so an option only counts when it is actually selected.

Goals follow WebShop's synthetic-goal recipe (goal.py `get_synthetic_goals`): a
target product, some of its attributes, one value per option, the instruction
"<request><' with name: value, and ...'><', and price lower than X.00 dollars'>"
and the price upper bound from WebShop's price rule. Goals come in random order;
the first `test_size` form the test split, as the reference validates on goals
0-499. Everything is drawn from one `random.Random(seed)`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .catalog import Catalog, Goal, Product, Review, option_text, price_upper_bound, sample_price
from .reward import COLOR_SET

CATEGORIES = ("beauty", "electronics", "fashion", "food", "furniture")


@dataclass(frozen=True)
class ProductType:
    category: str
    title_noun: str  # as written in titles
    noun: str  # as written in instructions
    plural: bool
    query: str
    path: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price_range: tuple[float, float]


def _t(category, title_noun, noun, query, path, attributes, options, price_range, plural=False) -> ProductType:
    return ProductType(
        category, title_noun, noun, plural, query, path, tuple(attributes),
        {k: tuple(v) for k, v in options.items()}, price_range,
    )


_APPAREL_SIZES = ("small", "medium", "large", "x-large", "xx-large")

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ----- beauty ------------------------------------------------------------------------
    _t("beauty", "Shampoo", "shampoo", "shampoo",
       "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
       ["sulfate free", "paraben free", "argan oil", "dry scalp", "hair growth", "color safe", "tea tree", "volumizing formula"],
       {"size": ["8.4 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz"], "scent": ["lavender", "coconut", "eucalyptus", "citrus", "unscented"]},
       (6, 90)),
    _t("beauty", "Lipstick", "lipstick", "lipstick",
       "Beauty & Personal Care › Makeup › Lips › Lipstick",
       ["long lasting", "matte finish", "moisturizing formula", "waterproof", "vegan", "cruelty free", "smudge proof", "shea butter"],
       {"color": ["ruby red", "pink", "coral", "plum", "nude", "berry"]},
       (5, 60)),
    _t("beauty", "Face Moisturizer", "face moisturizer", "face moisturizer",
       "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers › Face Moisturizers",
       ["hyaluronic acid", "oil free", "fragrance free", "sensitive skin", "anti aging", "vitamin c", "non comedogenic", "spf protection"],
       {"size": ["1.7 oz", "2.5 oz", "4 oz"]},
       (9, 110)),
    _t("beauty", "Nail Polish", "nail polish", "nail polish",
       "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
       ["quick dry", "chip resistant", "non toxic", "gel effect", "glossy finish", "long wear", "vegan formula", "base coat"],
       {"color": ["pink", "purple", "teal", "silver", "black", "coral"]},
       (4, 45)),
    _t("beauty", "Eau de Parfum Spray", "eau de parfum", "eau de parfum",
       "Beauty & Personal Care › Fragrance › Women's › Eau de Parfum",
       ["long lasting", "floral notes", "woody notes", "fresh scent", "travel size", "gift set", "alcohol free", "natural ingredients"],
       {"size": ["1 fl oz", "1.7 fl oz", "3.4 fl oz"]},
       (20, 300)),
    _t("beauty", "Hair Dryer", "hair dryer", "hair dryer",
       "Beauty & Personal Care › Hair Care › Styling Tools & Appliances › Hair Dryers & Accessories › Hair Dryers",
       ["ionic technology", "fast drying", "low noise", "diffuser attachment", "cool shot button", "foldable handle", "ceramic heating", "lightweight body"],
       {"color": ["black", "white", "pink", "rose gold"]},
       (20, 225)),
    # ----- electronics ---------------------------------------------------------------------
    _t("electronics", "Wireless Earbuds", "wireless earbuds", "wireless earbuds",
       "Electronics › Headphones, Earbuds & Accessories › Headphones & Earbuds › Earbud Headphones",
       ["noise cancelling", "charging case", "water resistant", "touch control", "deep bass", "built in microphone", "long battery life", "low latency"],
       {"color": ["black", "white", "blue", "pink"]},
       (15, 300), plural=True),
    _t("electronics", "Phone Case", "phone case", "phone case",
       "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
       ["shockproof", "kickstand", "card holder", "raised edges", "screen protector", "wireless charging", "anti scratch", "military grade"],
       {"color": ["black", "navy", "purple", "green", "pink"], "size": ["iphone 13", "iphone 14", "iphone 15", "galaxy s23"]},
       (8, 75)),
    _t("electronics", "USB C Cable", "usb c cable", "usb c cable",
       "Electronics › Computers & Accessories › Computer Accessories & Peripherals › Cables & Interconnects › USB Cables",
       ["fast charging", "braided nylon", "data sync", "tangle free", "aluminum connectors", "right angle", "lifetime warranty", "charging indicator"],
       {"size": ["3 ft", "6 ft", "10 ft"], "color": ["black", "white", "red", "grey"]},
       (5, 50)),
    _t("electronics", "Bluetooth Speaker", "bluetooth speaker", "bluetooth speaker",
       "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
       ["waterproof", "stereo sound", "long playtime", "built in microphone", "party lights", "outdoor use", "bass boost", "usb charging"],
       {"color": ["black", "camo", "teal", "grey"]},
       (20, 375)),
    _t("electronics", "Smart Watch", "smart watch", "smart watch",
       "Electronics › Wearable Technology › Smartwatches",
       ["heart rate monitor", "sleep tracking", "gps", "blood oxygen", "step counter", "message notifications", "swim proof", "long battery life"],
       {"color": ["black", "silver", "rose gold", "navy"]},
       (25, 500)),
    _t("electronics", "Power Bank", "power bank", "power bank",
       "Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
       ["fast charging", "usb c port", "led display", "compact design", "dual output", "airline approved", "flashlight", "solar panel"],
       {"size": ["10000mah", "20000mah", "26800mah"], "color": ["black", "white", "blue"]},
       (15, 150)),
    # ----- fashion ---------------------------------------------------------------------------
    _t("fashion", "Men's T-Shirt", "men's t-shirt", "men's t-shirts",
       "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
       ["machine wash", "short sleeve", "crew neck", "cotton blend", "relaxed fit", "moisture wicking", "tagless label", "graphic print"],
       {"color": ["black", "white", "navy", "heather grey", "red", "olive"], "size": _APPAREL_SIZES},
       (8, 75)),
    _t("fashion", "Men's Pullover Hoodie", "men's hoodie", "men's hoodies",
       "Clothing, Shoes & Jewelry › Men › Clothing › Active › Active Hoodies",
       ["fleece lined", "kangaroo pocket", "drawstring hood", "machine wash", "long sleeve", "ribbed cuffs", "athletic fit", "soft brushed interior"],
       {"color": ["black", "white", "navy", "heather grey", "olive"], "size": _APPAREL_SIZES},
       (18, 140)),
    _t("fashion", "Women's Jeans", "women's jeans", "women's jeans",
       "Clothing, Shoes & Jewelry › Women › Clothing › Jeans",
       ["high waist", "stretch fabric", "skinny fit", "button closure", "ankle length", "distressed look", "machine wash", "butt lifting"],
       {"color": ["black", "indigo", "blue", "white", "olive"], "size": ["26w x 30l", "28w x 30l", "30w x 32l", "32w x 32l"]},
       (20, 150), plural=True),
    _t("fashion", "Women's Running Shoes", "women's running shoes", "women's running shoes",
       "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
       ["breathable mesh", "memory foam", "non slip sole", "arch support", "lace up", "shock absorbing", "wide toe box", "lightweight design"],
       {"color": ["black", "white", "pink", "grey", "purple"], "size": ["6", "7", "8", "9", "10"]},
       (25, 225), plural=True),
    _t("fashion", "Women's Summer Dress", "women's summer dress", "women's summer dresses",
       "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
       ["floral print", "v neck", "side pockets", "knee length", "sleeveless", "flowy hem", "smocked waist", "beach vacation"],
       {"color": ["blue", "yellow", "green", "black", "pink"], "size": ["small", "medium", "large", "x-large"]},
       (18, 125)),
    _t("fashion", "Athletic Socks", "athletic socks", "athletic socks",
       "Clothing, Shoes & Jewelry › Men › Clothing › Socks › Athletic Socks",
       ["cushioned sole", "arch compression", "moisture control", "ankle cut", "reinforced heel", "odor resistant", "seamless toe", "six pairs"],
       {"color": ["white", "black", "grey", "mixed"], "size": ["medium", "large", "x-large"]},
       (8, 60), plural=True),
    # ----- food --------------------------------------------------------------------------------
    _t("food", "Protein Bars", "protein bars", "protein bars",
       "Grocery & Gourmet Food › Snacks & Sweets › Snack Foods › Bars › Protein Bars",
       ["gluten free", "low sugar", "high fiber", "keto friendly", "non gmo", "plant based", "no artificial sweeteners", "soy free"],
       {"flavor name": ["chocolate chip", "peanut butter", "cookie dough", "birthday cake", "salted caramel"], "size": ["12 count", "24 count"]},
       (12, 110), plural=True),
    _t("food", "Ground Coffee", "ground coffee", "ground coffee",
       "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
       ["fair trade", "organic beans", "kosher certified", "arabica", "single origin", "rainforest alliance", "low acid", "slow roasted"],
       {"flavor name": ["french roast", "breakfast blend", "colombian", "hazelnut", "vanilla"], "size": ["12 ounce", "2 pound"]},
       (8, 75), plural=True),
    _t("food", "Green Tea Bags", "green tea bags", "green tea",
       "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
       ["organic leaves", "antioxidant rich", "individually wrapped", "kosher certified", "sugar free", "non gmo", "biodegradable bags", "whole leaf"],
       {"flavor name": ["jasmine", "matcha", "lemon ginger", "mint", "honey"], "size": ["20 count", "50 count", "100 count"]},
       (4, 50), plural=True),
    _t("food", "Extra Virgin Olive Oil", "extra virgin olive oil", "extra virgin olive oil",
       "Grocery & Gourmet Food › Pantry Staples › Cooking Oils, Vinegars & Sprays › Oils › Olive Oil",
       ["cold pressed", "first harvest", "glass bottle", "non gmo", "kosher certified", "single estate", "high polyphenol", "mediterranean blend"],
       {"size": ["16.9 fl oz", "25.3 fl oz", "33.8 fl oz", "1 gallon"]},
       (10, 110), plural=True),
    _t("food", "Beef Jerky", "beef jerky", "beef jerky",
       "Grocery & Gourmet Food › Meat & Seafood › Jerky & Dried Meats › Beef Jerky",
       ["high protein", "low fat", "grass fed", "resealable bag", "gluten free", "no preservatives", "keto snack", "hickory smoked"],
       {"flavor name": ["original", "teriyaki", "peppered", "sweet and hot"], "size": ["2.8 ounce", "8 ounce", "16 ounce"]},
       (6, 100), plural=True),
    _t("food", "Trail Mix", "trail mix", "trail mix",
       "Grocery & Gourmet Food › Snacks & Sweets › Snack Foods › Trail Mix",
       ["roasted nuts", "dried fruit", "individually wrapped", "no added sugar", "vegan snack", "resealable pouch", "heart healthy", "protein packed"],
       {"flavor name": ["tropical", "chocolate", "cranberry almond", "sweet and salty"], "size": ["6 ounce", "26 ounce", "40 ounce"]},
       (5, 60), plural=True),
    # ----- furniture ----------------------------------------------------------------------------
    _t("furniture", "Office Chair", "office chair", "office chair",
       "Home & Kitchen › Furniture › Home Office Furniture › Home Office Desk Chairs",
       ["lumbar support", "adjustable height", "mesh back", "swivel base", "padded armrests", "easy assembly", "headrest", "rolling casters"],
       {"color": ["black", "grey", "white", "blue"]},
       (60, 625)),
    _t("furniture", "Bookshelf", "bookshelf", "bookshelf",
       "Home & Kitchen › Furniture › Home Office Furniture › Bookcases",
       ["solid wood", "easy assembly", "open storage", "industrial style", "metal frame", "anti tip kit", "adjustable shelves", "space saving"],
       {"color": ["walnut", "white", "black", "oak"], "size": ["3 tier", "4 tier", "5 tier"]},
       (35, 450)),
    _t("furniture", "Coffee Table", "coffee table", "coffee table",
       "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables",
       ["solid wood", "storage shelf", "lift top", "mid century", "easy assembly", "tempered glass", "hidden compartment", "round shape"],
       {"color": ["walnut", "black", "white", "natural"]},
       (50, 750)),
    _t("furniture", "Platform Bed Frame", "platform bed frame", "platform bed frame",
       "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases › Beds",
       ["no box spring needed", "metal slats", "under bed storage", "noise free", "upholstered headboard", "easy assembly", "heavy duty", "center support legs"],
       {"size": ["twin", "full", "queen", "king"], "color": ["black", "grey", "white"]},
       (90, 1000)),
    _t("furniture", "Bar Stools", "bar stools", "bar stools",
       "Home & Kitchen › Furniture › Game & Recreation Room Furniture › Home Bar Furniture › Barstools",
       ["swivel seat", "adjustable height", "footrest", "faux leather", "set of two", "back support", "armless design", "gas lift"],
       {"color": ["black", "brown", "grey", "white"], "size": ["24 inch", "30 inch"]},
       (40, 500), plural=True),
    _t("furniture", "Area Rug", "area rug", "area rug",
       "Home & Kitchen › Home Décor Products › Area Rugs, Runners & Pads › Area Rugs",
       ["non slip", "machine washable", "low pile", "stain resistant", "living room", "shag texture", "boho style", "easy vacuum"],
       {"color": ["beige", "grey", "blue", "multicolor"], "size": ["3x5", "5x7", "8x10"]},
       (25, 625)),
)

# Texts that fill bullet points, descriptions and reviews; none of them contains an
# option value (checked in the tests), so options only count when selected.
_BULLET_TAILS = (
    "designed for everyday use", "made to last", "backed by our support team", "a thoughtful gift idea",
    "easy to care for", "tested for quality", "loved by customers", "simple to use",
)
_DESCRIPTION_TAILS = (
    "Our team designs every item with care.", "Satisfaction guaranteed.", "A dependable choice for daily life.",
    "Well made and fairly priced.", "Ships in recyclable packaging.",
)
_REVIEW_TITLES = ("Great value", "Works as described", "Would buy again", "Not what I hoped", "Decent for the price", "Love it")
_REVIEW_BODIES = (
    "Arrived on time and matches the listing.", "Does the job as promised.", "Quality could be better.",
    "Exactly as pictured, very happy.", "Good purchase overall.", "It stopped meeting my needs after a month.",
)
_SYLLABLES = (
    "ko", "va", "zen", "li", "mo", "ra", "tri", "bel", "nor", "ax", "qui", "sol", "vy", "dar", "pi", "lu",
    "ne", "fa", "ro", "ti", "xo", "ze", "ka", "lo", "mi", "su", "ha", "jo", "ve", "ni",
)
_ASIN_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_REQUEST_TEMPLATES = (
    "i need {a}{noun} with {attrs}",
    "i am looking for {a}{noun} that has {attrs}",
    "i want {a}{attrs} {noun}",
)
_BRANDS_PER_CATEGORY = 24

DEFAULT_N_PRODUCTS = 1500
DEFAULT_N_GOALS = 2500
DEFAULT_TEST_SIZE = 500


def _join(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _article(next_word: str, plural: bool) -> str:
    if plural:
        return ""
    return "an " if next_word[:1] in "aeiou" else "a "


def _brands(rng: random.Random, count: int) -> list[str]:
    # Brand names must not contain a colour or an option value: goal.py would then
    # find that value in the title and count the option as matched.
    forbidden = set(COLOR_SET) | {v for t in PRODUCT_TYPES for vs in t.options.values() for v in vs}
    brands: list[str] = []
    seen: set[str] = set()
    while len(brands) < count:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3))))
        if len(name) < 5 or name in seen or any(f in name for f in forbidden):
            continue
        seen.add(name)
        brands.append(name.capitalize())
    return brands


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(_ASIN_CHARS, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _product(rng: random.Random, ptype: ProductType, brand: str, asin: str) -> Product:
    attrs = rng.sample(ptype.attributes, rng.randint(2, 5))
    options = {}
    for name, values in ptype.options.items():
        # Each product offers only some values, so a goal's option narrows the choice.
        k = rng.randint(1, len(values) - 1) if len(values) > 1 else 1
        chosen = set(rng.sample(range(len(values)), k))
        options[name] = tuple(v for i, v in enumerate(values) if i in chosen)
    lo, hi = ptype.price_range
    # Log-uniform, so cheap and expensive listings of a type both occur.
    low = round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 2)
    pricing = (low, round(low * rng.uniform(1.1, 1.6), 2)) if rng.random() < 0.25 else (low,)
    title = f"{brand} {ptype.title_noun}, " + ", ".join(a.title() for a in attrs[:2])
    bullets = tuple(f"{a.capitalize()}: {rng.choice(_BULLET_TAILS)}" for a in attrs)
    description = (
        f"{brand} {ptype.noun} with {_join(attrs)}. {rng.choice(_DESCRIPTION_TAILS)}"
    )
    reviews = tuple(
        Review(rng.choice(_REVIEW_TITLES), rng.randint(1, 5), rng.choice(_REVIEW_BODIES)) for _ in range(rng.randint(0, 3))
    )
    rating = f"{sum(r.score for r in reviews) / len(reviews):.1f}" if reviews else "N.A."
    return Product(
        asin=asin,
        title=title,
        category=ptype.category,
        query=ptype.query,
        product_category=ptype.path,
        options=options,
        pricing=pricing,
        attributes=tuple(attrs),
        bullet_points=bullets,
        description=description,
        reviews=reviews,
        rating=rating,
    )


def _goal(rng: random.Random, product: Product, ptype: ProductType, price: float) -> Goal:
    wanted = rng.sample(product.attributes, min(len(product.attributes), rng.choice((1, 2, 2, 3, 3))))
    # WebShop lists goal options by sorted option name.
    goal_options = {name: rng.choice(product.options[name]) for name in sorted(product.options)}
    attrs = _join(wanted)
    template = rng.choice(_REQUEST_TEMPLATES)
    first_word = attrs if template.startswith("i want") else ptype.noun
    request = template.format(a=_article(first_word, ptype.plural), noun=ptype.noun, attrs=attrs)
    price_upper, price_text = price_upper_bound(price, rng)
    return Goal(
        asin=product.asin,
        category=product.category,
        query=product.query,
        name=product.title,
        product_category=product.product_category,
        instruction_text=f"{request}{option_text(goal_options)}{price_text}",
        attributes=tuple(wanted),
        price_upper=price_upper,
        goal_options=goal_options,
    )


def generate_catalog(
    seed: int = 0,
    n_products: int = DEFAULT_N_PRODUCTS,
    n_goals: int = DEFAULT_N_GOALS,
    test_size: int = DEFAULT_TEST_SIZE,
) -> Catalog:
    """A deterministic synthetic catalog: products spread evenly over the product types."""
    if n_products < len(PRODUCT_TYPES):
        raise ValueError(f"n_products must be at least {len(PRODUCT_TYPES)} (one per product type), got {n_products}")
    if n_goals < 2:
        raise ValueError(f"n_goals must be at least 2, got {n_goals}")
    if not 0 < test_size < n_goals:
        raise ValueError(f"test_size must be in [1, n_goals - 1] = [1, {n_goals - 1}], got {test_size}")
    rng = random.Random(seed)
    brands = {c: _brands(rng, _BRANDS_PER_CATEGORY) for c in CATEGORIES}
    taken: set[str] = set()
    products: list[Product] = []
    types_of: list[ProductType] = []
    for i in range(n_products):
        ptype = PRODUCT_TYPES[i % len(PRODUCT_TYPES)]
        products.append(_product(rng, ptype, rng.choice(brands[ptype.category]), _asin(rng, taken)))
        types_of.append(ptype)
    # Shuffle so catalog order (and BM25 tie order) does not follow the type cycle.
    order = list(range(n_products))
    rng.shuffle(order)
    products = [products[i] for i in order]
    types_of = [types_of[i] for i in order]
    prices = {p.asin: sample_price(p.pricing, rng) for p in products}

    goals: list[Goal] = []
    targets: list[int] = []
    while len(targets) < n_goals:
        targets += rng.sample(range(n_products), min(n_products, n_goals - len(targets)))
    for idx in targets:
        p = products[idx]
        goals.append(_goal(rng, p, types_of[idx], prices[p.asin]))
    splits = ["test" if i < test_size else "train" for i in range(n_goals)]
    return Catalog(products=products, goals=goals, splits=splits, prices=prices, source=f"synthetic(seed={seed})")
