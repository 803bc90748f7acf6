"""The README's Python examples run as written, and its two commands exist in the Makefile."""

import re

import numpy as np
import pytest
from conftest import REPO


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_readme_classifier_example_builds_and_trains():
    blocks = _python_blocks((REPO / "README.md").read_text())
    assert blocks, "README.md has no ```python example"
    namespace: dict = {}
    exec(blocks[0], namespace)  # noqa: S102 - the README is ours
    classifier = namespace["classifier"]
    batch = {name: np.ones((3, 12), "int32") for name in
             ("input_word_ids", "input_mask", "input_type_ids")}
    assert classifier.predict(batch, verbose=0).shape == (3, 2)
    loss = classifier.train_on_batch(batch, np.array([0, 1, 0]))
    assert np.isfinite(loss)


def test_readme_commands_are_make_targets():
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
