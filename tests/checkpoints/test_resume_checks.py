"""A resume is checked against what its model_dir was trained as: task, labels, sequence length,
encoder architecture, vocabulary and casing (`model_dir.check_resume`)."""

import pytest
from robust_testing import tree_digest

from bert_trainer.checkpoints import model_dir
from bert_trainer.encoders import BertEncoder
from bert_trainer.errors import UserError

TINY = dict(vocab_size=50, hidden_size=32, num_layers=2, num_attention_heads=2, inner_dim=64,
            max_sequence_length=16, type_vocab_size=2)
SST2 = {"name": "sst2", "family": "classification", "label_names": ["negative", "positive"],
        "seq_length": 16}


@pytest.fixture
def trained(tmp_path):
    """A model_dir with bert_train.json (task sst2), its vocab and a checkpoint file."""
    vocab = tmp_path / "vocab_in.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(50)), encoding="utf-8")
    directory = tmp_path / "run"
    encoder = BertEncoder(**TINY)
    model_dir.write_model_info(str(directory), encoder, vocab_file=str(vocab), task=SST2)
    (directory / "ckpt-5.index").write_bytes(b"")
    return {"dir": str(directory), "vocab": str(vocab), "config": encoder.get_config()}


def check(trained, *, config=None, vocab=None, lower_case=True, task=None, **kwargs):
    model_dir.check_resume(trained["dir"], encoder_class="BertEncoder",
                           encoder_config=config or trained["config"],
                           vocab_file=vocab or trained["vocab"], lower_case=lower_case,
                           task=SST2 if task is None else task, **kwargs)


def test_the_same_run_resumes(trained):
    before = tree_digest(trained["dir"])
    check(trained)
    # Dropout, dtype and other run-time settings may change.
    check(trained, config={**trained["config"], "output_dropout": 0.3, "dtype": "bfloat16"})
    check(trained, vocab=f"{trained['dir']}/vocab.txt")  # its own copy
    assert tree_digest(trained["dir"]) == before


def test_a_fresh_or_untrained_directory_is_not_checked(tmp_path, trained):
    other = {**SST2, "name": "conll2003"}
    with pytest.raises(UserError, match="was trained as task 'sst2'"):
        check(trained, task=other)  # trained: refused
    check({**trained, "dir": str(tmp_path / "nothing")}, task={"name": "squad"})
    assert not (tmp_path / "nothing").exists()  # checking created nothing
    (tmp_path / "run" / "ckpt-5.index").unlink()  # info written, but nothing trained yet
    before = tree_digest(trained["dir"])
    check(trained, task=other)  # the same request now passes
    assert tree_digest(trained["dir"]) == before


@pytest.mark.parametrize("change, message", [
    (dict(task={**SST2, "name": "cola"}),
     "was trained as task 'sst2' (labels ['negative', 'positive']); this run asks for task "
     "'cola' (labels ['negative', 'positive']); use another --model_dir"),
    (dict(task={**SST2, "label_names": ["bad", "good"]}),
     "with label_names=['negative', 'positive']; this run asks for label_names=['bad', 'good']"),
    (dict(task={**SST2, "seq_length": 8}), "with seq_length=16; this run asks for seq_length=8"),
    (dict(config={**TINY, "num_layers": 4}),
     "holds a checkpoint of another architecture: num_layers=2 in {dir}/bert_train.json, this "
     "run asks for num_layers=4; use another --model_dir"),
    (dict(lower_case=False), "was trained with lower_case=True; this run asks for "
     "lower_case=False"),
])
def test_a_resume_as_something_else_is_refused(trained, change, message):
    before = tree_digest(trained["dir"])
    with pytest.raises(UserError) as refused:
        check(trained, **change)
    assert message.format(dir=trained["dir"]) in str(refused.value)
    assert str(refused.value).startswith((f"--model_dir={trained['dir']} ",
                                          f"model_dir {trained['dir']} "))
    assert "\n" not in str(refused.value)
    assert tree_digest(trained["dir"]) == before


def test_another_vocabulary_of_the_same_size_is_refused(trained, tmp_path):
    other = tmp_path / "other_vocab.txt"
    other.write_text("".join(f"tok{i}\n" for i in reversed(range(50))), encoding="utf-8")
    with pytest.raises(UserError, match=rf"was trained with the vocabulary {trained['dir']}/"
                       rf"vocab.txt; this run's {other} differs from it; use another "):
        check(trained, vocab=str(other))


def test_pretraining_may_change_the_sequence_length(trained):
    pretraining = {"name": "pretraining", "family": "pretraining", "seq_length": 128}
    model_dir.write_model_info(trained["dir"], BertEncoder(**TINY), vocab_file=trained["vocab"],
                               task=pretraining)
    longer = {**pretraining, "seq_length": 512}
    with pytest.raises(UserError, match="with seq_length=128; this run asks for seq_length=512"):
        check(trained, task=longer)  # fine-tuning's keys compare the sequence length
    before = tree_digest(trained["dir"])
    check(trained, task=longer, task_keys=("name", "family"))  # pretraining's do not
    assert tree_digest(trained["dir"]) == before
