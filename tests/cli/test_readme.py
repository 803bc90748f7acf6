"""The docs' Python examples run as written; the README is a short front door whose two
commands exist in the Makefile and whose links reach every page of docs/."""

import re

import numpy as np
import pytest
from conftest import REPO

LIBRARY = REPO / "docs" / "library.md"  # the layer library's examples, run below
README_MAX_LINES = 150


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_readme_classifier_example_builds_and_trains():
    blocks = _python_blocks(LIBRARY.read_text())
    assert blocks, "docs/library.md has no ```python example"
    namespace: dict = {}
    exec(blocks[0], namespace)  # noqa: S102 - the docs are ours
    classifier = namespace["classifier"]
    batch = {name: np.ones((3, 12), "int32") for name in
             ("input_word_ids", "input_mask", "input_type_ids")}
    assert classifier.predict(batch, verbose=0).shape == (3, 2)
    loss = classifier.train_on_batch(batch, np.array([0, 1, 0]))
    assert np.isfinite(loss)


@pytest.mark.slow  # builds two models and decodes in this process
def test_readme_decoder_examples_translate_and_generate():
    blocks = _python_blocks(LIBRARY.read_text())
    assert len(blocks) >= 3, "docs/library.md lost its decoder examples"
    namespace: dict = {}
    exec(blocks[1], namespace)  # noqa: S102 - the docs are ours
    assert namespace["logits"].shape == (1, 3, 1000)
    out = namespace["out"]
    assert out["decoded_ids"].shape == (1, 8) and out["decoded_scores"].shape == (1,)
    exec(blocks[2], namespace)  # noqa: S102
    assert namespace["logits"].shape == (1, 4, 1000)
    greedy, sampled = namespace["greedy"], namespace["sampled"]
    for result in (greedy, sampled):
        assert result["generated_ids"].shape == (2, 8)
        assert result["generated_ids"].dtype == np.int32
        assert np.all(result["generated_lengths"].numpy() <= 8)
    # The greedy continuation is the argmax of the model's own logits at each new position.
    gpt, prompt = namespace["gpt"], np.array([[3, 17, 25]], "int32")
    first = int(np.argmax(gpt({"input_word_ids": prompt})["logits"][0, -1, 1:])) + 1  # no [PAD]
    assert int(greedy["generated_ids"][0, 0]) == (0 if first == 3 else first)  # 3: the end


def test_readme_commands_are_make_targets():
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, flags=re.M), target


def _links(path) -> list[str]:
    """The relative targets of `path`'s Markdown links (web addresses left out)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def _anchors(path) -> set[str]:
    """GitHub's anchors for `path`'s headings: lower case, punctuation dropped, '-' for ' '."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_is_a_front_door_linking_every_docs_page():
    readme = REPO / "README.md"
    lines = readme.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference to docs/")
    linked = {t.partition("#")[0] for t in _links(readme)}
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert pages, "docs/ has no pages"
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert "benchmarks/README.md" in linked


def test_every_relative_link_in_the_readme_and_docs_exists():
    for page in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        for target in _links(page):
            name, _, anchor = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            where = f"{page.relative_to(REPO)} links {target}"
            assert path.exists(), f"{where}: no such file"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{where}: no such heading"
