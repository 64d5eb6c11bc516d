"""A dependency-free stand-in for the spaCy noun tagging in WebShop's type reward.

WebShop's r_type parses both product names with spaCy's `en_core_web_lg` and keeps
the lower-cased tokens tagged NOUN or PROPN. That model is not available here, so
this module approximates it with a documented rule:

1. lower-case the name and drop possessive "'s" (spaCy splits it off as a particle);
2. split into alphabetic runs (digits and punctuation separate tokens, as spaCy's
   tokenizer does for "T-Shirt", "12oz" or "6.7"), so numbers never count;
3. drop one-letter runs, function words (determiners, pronouns, prepositions,
   conjunctions, auxiliaries, particles), spelled-out numbers, and a closed list of
   adjectives and adverbs common in product titles (colours, sizes, qualities).

Everything that remains counts as a noun. Product names on Amazon are written in
title case, and spaCy tags most of their content words as PROPN, so "content word
= noun" is close to what the reference sees; the lists below remove the words spaCy
reliably tags otherwise. Duplicates are kept because goal.py divides by the number
of noun tokens, not the number of distinct nouns.
"""

from __future__ import annotations

import re
from functools import lru_cache

_WORD_RE = re.compile(r"[a-z]+")
_POSSESSIVE_RE = re.compile(r"['’]s\b")

FUNCTION_WORDS = frozenset(
    """
    a an the this that these those some any each every all both either neither no
    i me my mine you your yours he him his she her hers it its we us our ours they them their theirs
    who whom whose which what
    and or but nor so yet if than then as while because though although
    of in on at to from by for with without into onto over under above below between among
    about across after against along around before behind beside besides beyond during
    except inside near off out outside per since through throughout till toward towards
    until up upon via within down
    is am are was were be been being has have had having do does did done
    can could will would shall should may might must
    not very too also just only more most less least much many few several other another
    such same own s t
    """.split()
)

NUMBER_WORDS = frozenset(
    """
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty hundred thousand
    first second third fourth fifth single double triple
    """.split()
)

# Adjectives and adverbs that recur in product titles; spaCy tags these ADJ/ADV.
MODIFIER_WORDS = frozenset(
    """
    new best great good premium high low large small big mini medium extra super ultra
    soft hard light dark heavy long short wide narrow thin thick slim full half tall
    natural organic original classic modern vintage retro rustic portable wireless waterproof
    durable adjustable compatible professional deluxe perfect easy quick fast slow comfortable
    casual formal cute pretty beautiful elegant stylish fashionable fresh free pure real
    stainless solid clear sweet spicy hot cold warm cool dry wet smooth rough raw whole
    lightweight breathable washable removable rechargeable reusable foldable waterproof
    universal multi non anti extra-large plus petite regular oversized sleeveless
    black white red blue green yellow pink purple grey gray brown orange beige navy silver
    gold golden ivory khaki teal turquoise maroon burgundy tan cream olive coral violet
    lavender nude plum mint charcoal
    quiet loud simple basic smart cordless ergonomic heavy-duty compact sturdy strong
    healthy tasty delicious crunchy creamy salted unsalted sugarless
    matte glossy shiny sheer floral striped plaid solid printed
    mens womens unisex kids
    really well always never often
    """.split()
)

_NOT_NOUNS = FUNCTION_WORDS | NUMBER_WORDS | MODIFIER_WORDS


@lru_cache(maxsize=65536)
def noun_tokens(name: str) -> tuple[str, ...]:
    """Lower-cased noun tokens of a product name, in order, duplicates kept."""
    text = _POSSESSIVE_RE.sub("", str(name).lower())
    return tuple(w for w in _WORD_RE.findall(text) if len(w) > 1 and w not in _NOT_NOUNS)
