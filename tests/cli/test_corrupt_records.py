"""A truncated or corrupt TFRecord shard under `pretrain` (both objectives) is one line naming
the shard and the byte offset, not a 70-line DataLossError traceback."""

import glob
import pathlib
import shutil

import bad_input_cases
import gin
import pytest

from bert_trainer import cli
from bert_trainer.errors import EXIT_USER_ERROR


@pytest.fixture(scope="module")
def shards(tiny_pretrained, tmp_path_factory):
    """Causal blocks and masked-LM examples, 2 shards each, the second cut 7 bytes short (the
    sweep's own, `bad_input_cases.truncated_shards`): {kind: (glob, truncated shard)}."""
    root = tmp_path_factory.mktemp("corrupt_records")
    vocab = tiny_pretrained["vocab_file"]
    found = bad_input_cases.truncated_shards(root, vocab)
    pairs = {kind: (found[f"truncated_{kind}"], sorted(glob.glob(found[f"truncated_{kind}"]))[-1])
             for kind in ("blocks", "mlm")}
    return {"vocab": vocab, **pairs, "root": root}


def run(capsys, *args) -> tuple[int, list[str]]:
    gin.clear_config()  # what a fresh process would have
    capsys.readouterr()
    rc = cli.main(["bert-train", "pretrain", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return rc, [line for line in err.splitlines() if line.startswith("bert-train")]


def test_truncated_shards_are_one_line_naming_the_shard(shards, capsys, tmp_path):
    common = ["--gin_param=TrainerConfig.train_steps = 40", f"--vocab_file={shards['vocab']}"]
    causal = ["--gin_file=configs/causal_lm/tiny.gin", f"--train_data={shards['blocks'][0]}",
              "--gin_param=build_causal_lm.hidden_size = 32",
              "--gin_param=build_causal_lm.vocab_size = 3000",
              "--gin_param=CausalLMConfig.block_size = 32"]
    masked = ["--gin_file=configs/smoke.gin", f"--train_data={shards['mlm'][0]}",
              "--gin_param=PretrainingConfig.seq_length = 32",
              "--gin_param=build_encoder.vocab_size = 3000"]
    for name, args in (("blocks", causal), ("mlm", masked)):
        model_dir = tmp_path / name
        rc, lines = run(capsys, *args, *common, f"--model_dir={model_dir}")
        assert rc == EXIT_USER_ERROR and len(lines) == 1, lines
        assert f"{shards[name][1]}: truncated record at byte " in lines[0], lines[0]
        assert "recreate the shard with 'bert-train create_pretraining_data'" in lines[0]
    shutil.rmtree(tmp_path)


def test_a_corrupt_record_is_found_with_its_byte_offset(shards, tmp_path):
    from bert_trainer.data import record_faults  # noqa: PLC0415

    pattern, truncated = shards["mlm"]
    good = pathlib.Path(sorted(p for p in glob.glob(pattern) if p != truncated)[0])
    assert record_faults.damage(str(good)) is None
    flipped = tmp_path / "flipped.tfrecord"
    data = bytearray(good.read_bytes())
    data[40] ^= 0xFF  # inside the first record's payload: its CRC no longer matches
    flipped.write_bytes(bytes(data))
    assert record_faults.damage(str(flipped)) == "corrupted record at byte 12"  # its payload
    error = record_faults.locate(RuntimeError("x"), {"--train_data": pattern,
                                                     "--eval_data": None})
    assert str(error).startswith(f"{truncated}: truncated record at byte ")
    assert str(error).endswith(f"(a shard of --train_data={pattern}); recreate the shard with "
                               "'bert-train create_pretraining_data', or leave it out of "
                               "--train_data")
