"""The method cards: each method's card lives beside its code, the docs' card table is made
from them (`python -m tfaccel.methods.cards`), and neither changes without the other."""

import io
import json
import pathlib
import re
import tokenize

import pytest

from tfaccel import methods
from tfaccel.methods import cards

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIELDS = ("changes", "helps", "hurts", "measured", "defaults")


def _method_classes() -> list[type]:
    """Every method class `tfaccel.methods` exports."""
    found = [getattr(methods, name) for name in methods.__all__]
    return [c for c in found if isinstance(c, type) and issubclass(c, methods.Method)]


def test_the_page_shows_the_cards_of_the_code():
    text = cards.PAGE.read_text(encoding="utf-8")
    assert cards.updated(text) == text, (
        "docs/how-to/train-to-accuracy.md's method cards differ from the cards in "
        "tfaccel/methods/: edit the cards there and run `python -m tfaccel.methods.cards`"
    )
    assert cards.main(["--check"]) == 0


def test_every_method_has_a_card_on_the_page():
    classes = [c for c in _method_classes() if c is not methods.Method]
    assert sorted(c.__name__ for c in classes) == sorted(c.__name__ for c in cards.METHODS)
    page = cards.PAGE.read_text(encoding="utf-8")
    for cls in classes:
        assert isinstance(cls.card, methods.Card), cls
        assert f"`{cards.signature(cls)}`" in page and f"### {cls.__name__}\n" in page
    assert methods.Method.card is None
    assert cards.signature(methods.EMA) == "EMA(decay=0.99)"


@pytest.mark.parametrize("heading", [h for h, _, _ in cards.cards()])
def test_each_card_is_complete_and_names_its_results(heading):
    card = next(c for h, _, c in cards.cards() if h == heading)
    for field in FIELDS:
        text = getattr(card, field)
        assert text.strip(), f"{heading}: empty {field}"
        assert "|" not in text and "\n" not in text, f"{heading}: {field} breaks the table"
    if card.measured_as is None:  # no measurement: the card says so, and names no result
        assert card.measured == cards.NOT_MEASURED and not card.results and not card.contender
        return
    assert card.results, f"{heading}: figures without the result file they come from"
    for name in card.results:
        assert (RESULTS / name).is_file(), f"{heading}: no benchmarks/results/{name}"
    if card.contender:
        table = json.loads((RESULTS / card.results[0]).read_text())["jobs"]
        contenders = {c for job in table.values() for c in job["contenders"]}
        assert card.contender in contenders, f"{heading}: {card.contender} not in the results"


def test_a_card_edited_on_the_page_alone_fails_the_check(tmp_path, capsys):
    page = tmp_path / "page.md"
    text = cards.PAGE.read_text(encoding="utf-8")
    edited = text.replace("final 0.956 vs 0.952", "final 0.990 vs 0.952")
    assert edited != text
    page.write_text(edited, encoding="utf-8")
    assert cards.main(["--check", "--page", str(page)]) == 1
    assert "python -m tfaccel.methods.cards" in capsys.readouterr().err
    assert cards.main(["--page", str(page)]) == 0  # made again from the code
    assert page.read_text(encoding="utf-8") == text
    assert cards.main(["--check", "--page", str(page)]) == 0


def test_only_the_block_between_the_markers_is_made():
    block = f"{cards.BEGIN}\nstale\n{cards.END}"
    made = cards.updated(f"# Page\n\nbefore\n\n{block}\n\nafter\n")
    assert made.startswith("# Page\n\nbefore\n\n" + cards.BEGIN)
    assert made.endswith(cards.END + "\n\nafter\n") and "stale" not in made
    assert "| method | changes | helps | hurts | defaults |" in made
    assert '### methods="fast"' in made
    for text in ("no markers", f"{cards.END}\n{cards.BEGIN}", block + block):
        with pytest.raises(ValueError, match="card markers"):
            cards.updated(text)


# A measured figure: a decimal ratio (0.44x, 0.36×) or time (0.3 s), a range of readings
# (0.796-0.803), a count of seeds or runs. Settings (8x, 40 %) may stay: they are the rule.
FIGURE = re.compile(
    r"\d\.\d+\s*[x×]|\d\.\d+ s\b|\d\.\d+\s*[-–]\s*\d\.\d+|\b\d+ (seeds|runs)\b|\bseed \d"
)


def test_code_comments_in_methods_state_rules_not_figures():
    """The evidence lives on the cards and in benchmarks/results/; a comment keeps the rule
    and names the benchmark result that set it."""
    found = []
    for path in sorted((ROOT / "tfaccel" / "methods").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and FIGURE.search(token.string):
                found.append(f"{path.name}:{token.start[0]}: {token.string}")
    assert not found, "figures in code comments (move them to the card):\n" + "\n".join(found)
