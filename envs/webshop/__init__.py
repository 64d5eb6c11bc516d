"""WebShop (princeton-nlp/WebShop) text mode as a TextEnv; see env.py."""

from .catalog import Catalog, Goal, Product, Review
from .env import WebShopEnv
from .loader import load_webshop
from .reward import purchase_reward
from .synthetic import generate_catalog

__all__ = ["Catalog", "Goal", "Product", "Review", "WebShopEnv", "generate_catalog", "load_webshop", "purchase_reward"]
