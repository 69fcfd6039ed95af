"""The method cards as the docs show them: a table made from each method's `card`.

Each method class carries a `Card` (`Method.card`; `methods="fast"` has `FAST_CARD`): what
it changes, when it helps, where it hurts, what it measured here and what set its
defaults, naming the files in `benchmarks/results/` its figures come from. The card table
of the how-to "Train to accuracy sooner" (docs/how-to/train-to-accuracy.md) is made from
them, between two markers:

- `python -m tfaccel.methods.cards` rewrites the page's cards from the code;
- `python -m tfaccel.methods.cards --check` exits 1 when the page and the cards differ
  (tests/test_method_cards.py runs it: neither is edited without the other).
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import sys
import textwrap

from tfaccel.methods.adaptive.plateau import Plateau
from tfaccel.methods.averaging import EMA
from tfaccel.methods.base import Card, Method
from tfaccel.methods.batch_growth import ProgressiveBatch
from tfaccel.methods.composition import FAST_CARD
from tfaccel.methods.depth import StochasticDepth
from tfaccel.methods.freezing import LayerFreezing
from tfaccel.methods.label_methods import CutMix, LabelSmoothing, MixUp
from tfaccel.methods.resizing import ProgressiveResizing
from tfaccel.methods.schedules import OneCycle, WarmupCosine

# The methods in the order the page shows their cards ("fast" last).
METHODS: tuple[type[Method], ...] = (
    LabelSmoothing,
    MixUp,
    CutMix,
    EMA,
    OneCycle,
    WarmupCosine,
    Plateau,
    ProgressiveBatch,
    LayerFreezing,
    StochasticDepth,
    ProgressiveResizing,
)
PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "how-to" / "train-to-accuracy.md"
BEGIN = (
    "<!-- method cards: made by `python -m tfaccel.methods.cards` from the `card` of each "
    "method in tfaccel/methods/; edit the cards there and run it again -->"
)
END = "<!-- method cards: end -->"
RESULTS = "benchmarks/results"
NOT_MEASURED = "not measured here"
WIDTH = 92  # the page's line length for the cards' paragraphs


def signature(cls: type[Method]) -> str:
    """The method with its defaults, as a user would write it: `EMA(decay=0.99)`."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    given = [p for p in parameters if p.default is not inspect.Parameter.empty]
    return f"{cls.__name__}({', '.join(f'{p.name}={p.default!r}' for p in given)})"


def cards() -> list[tuple[str, str, Card]]:
    """`(heading, method with its defaults, card)` for each method in `METHODS`, then
    for `methods="fast"`.

    Raises:
        ValueError: a method without a card.
    """
    found = []
    for cls in METHODS:
        if cls.card is None:
            raise ValueError(f"{cls.__name__} has no card: give it `card = Card(...)`.")
        found.append((cls.__name__, f"`{signature(cls)}`", cls.card))
    return [*found, ('methods="fast"', '`methods="fast"`', FAST_CARD)]


def _measured(card: Card) -> str:
    """The card's paragraph: the setting measured, where the figures are, the figures."""
    if card.measured_as is None:
        return f"**Measured**: {card.measured}"
    where = ", ".join(f"`{RESULTS}/{name}`" for name in card.results)
    contender = f"contender `{card.contender}` of " if card.contender else ""
    return f"**Measured** as `{card.measured_as}` ({contender}{where}): {card.measured}"


def render() -> str:
    """The page's card block (between the markers): a table of what each method changes,
    when it helps, where it hurts and what set its defaults; then each card's figures."""
    lines = [
        "| method | changes | helps | hurts | defaults |",
        "| --- | --- | --- | --- | --- |",
    ]
    sections = []
    for heading, method, card in cards():
        cells = (method, card.changes, card.helps, card.hurts, card.defaults)
        lines.append("| " + " | ".join(cells) + " |")
        paragraph = textwrap.fill(
            _measured(card), WIDTH, break_long_words=False, break_on_hyphens=False
        )
        sections += ["", f"### {heading}", "", paragraph]
    return "\n".join(lines + sections)


def updated(text: str) -> str:
    """`text` (the page) with its card block made again from the cards.

    Raises:
        ValueError: the page lacks the two markers, or holds them more than once.
    """
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(
            f"The page needs the card markers once each, in order: {BEGIN!r} then {END!r} "
            "(the cards are written between them)."
        )
    head, rest = text.split(BEGIN)
    tail = rest.split(END)[1]
    return f"{head}{BEGIN}\n\n{render()}\n\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Rewrites the page's cards (or with `--check`, says whether they are current).

    Returns:
        0, or with `--check` 1 when the page and the cards differ.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    parser.add_argument("--page", type=pathlib.Path, default=PAGE, help="the how-to page")
    args = parser.parse_args(argv)
    if not args.page.exists():
        parser.error(f"no page at {args.page}: pass --page (run from a clone of the repo).")
    text = args.page.read_text(encoding="utf-8")
    new = updated(text)
    if args.check:
        if new != text:
            print(
                f"{args.page}: the method cards differ from the code's; run "
                "`python -m tfaccel.methods.cards` (and edit the cards in tfaccel/methods/, "
                "not the page).",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != text:
        args.page.write_text(new, encoding="utf-8")
    print(f"{args.page}: {'rewritten' if new != text else 'current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
