"""A pretraining shard deleted while `pretrain` reads it: the steps done are checkpointed, then
one line names the file (was: a 67-line NotFoundError traceback, exit 1, no checkpoint)."""

import pytest
from conftest import SHARED
from finetune_testing import run_in_process
from robust_testing import checkpoint_steps

from bert_trainer.errors import EXIT_USER_ERROR
from bert_trainer.training.trainer import Trainer


@pytest.mark.slow  # a pretraining run
def test_a_shard_deleted_mid_run_is_named_after_a_checkpoint(pretraining_data, tmp_path,
                                                             capsys, monkeypatch):
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus  # noqa: PLC0415

    # Two small shards (two addresses): an epoch is a few steps, and the next one opens the
    # shards again.
    texts = sorted((SHARED / "data" / "corpus" / "inaugural").glob("18[01]*.txt"))[:2]
    pattern = str(tmp_path / "data" / "train-*.tfrecord")
    corpus.create_pretraining_data(",".join(map(str, texts)), pretraining_data["vocab_file"],
                                   pattern, corpus.PretrainingDataConfig(max_seq_length=64,
                                                                         seed=1),
                                   CorpusOptions(num_shards=2), progress=None)
    [_, doomed] = sorted((tmp_path / "data").glob("train-*.tfrecord"))
    real = Trainer.run_steps

    def run_steps(self, iterator, num_steps):  # the shard goes once the run has trained
        real(self, iterator, num_steps)
        doomed.unlink(missing_ok=True)

    monkeypatch.setattr(Trainer, "run_steps", run_steps)
    run = tmp_path / "run"
    capsys.readouterr()
    rc = run_in_process(
        "pretrain", "--gin_file=configs/smoke.gin", f"--model_dir={run}",
        f"--gin_param=build_encoder.vocab_size = {pretraining_data['vocab_size']}",
        "--gin_param=TrainerConfig.train_steps = 1000",
        "--gin_param=PretrainingConfig.train_batch_size = 4",
        "--gin_param=PretrainingConfig.shuffle_buffer = 10",
        f"--train_data={pattern}", f"--vocab_file={pretraining_data['vocab_file']}")
    err = capsys.readouterr().err
    assert rc == EXIT_USER_ERROR, err[-3000:]  # was an uncaught NotFoundError
    assert "Traceback" not in err
    assert checkpoint_steps(run), err[-3000:]
    [saved] = checkpoint_steps(run)  # the work since the last checkpoint (none: interval 50)
    assert 10 <= saved < 1000
    lines = [line for line in err.splitlines() if line.startswith("bert-train pretrain:")]
    assert lines == [f"bert-train pretrain: error: {doomed} was deleted while the run read it "
                     f"(a shard of --train_data={pattern}); the steps trained are saved in "
                     f"{run}/ckpt-{saved}; put it back, or leave it out of --train_data, and "
                     "run the same command again to resume"]
