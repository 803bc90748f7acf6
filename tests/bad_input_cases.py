"""The case tables of the bad-input sweep (tests/cli/test_bad_inputs.py): malformed files and argv.

Each case is (name, argv, a part of the one-line message that names the offending thing). An
argv element's {name} is a path of test_bad_inputs.py's `paths` fixture (names may hold dots:
{lines.txt}); {fresh} is a model_dir that must still not exist afterwards.
"""

import json

SST2_HEADER = "sentence\tlabel\n"
GOOD_ROWS = "".join(f"a {w} film\t{i % 2}\n" for i, w in enumerate(
    ["fine", "bad", "great", "dull", "lovely", "awful", "superb", "poor"] * 3))
SQUAD_CONTEXT = "The cat sat on the mat."


def squad(answer_text: str, answer_start: int) -> str:
    qa = {"id": "q1", "question": "Who sat?",
          "answers": [{"text": answer_text, "answer_start": answer_start}]}
    return json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": SQUAD_CONTEXT, "qas": [qa]}]}]})


CONLL_GOOD = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n. . O O\n\n"


# The text files of the sweep, written by the `inputs` fixture under their names.
BAD_FILES = {
    "empty.tsv": "",
    "good.tsv": SST2_HEADER + GOOD_ROWS,
    "good_squad.json": squad("cat", 4),
    "good.conll": CONLL_GOOD * 3,
    "columns.tsv": SST2_HEADER + GOOD_ROWS + "a film with no label\n",
    "extra_column.tsv": SST2_HEADER + GOOD_ROWS + "a\tb\t1\n",
    "label.tsv": SST2_HEADER + GOOD_ROWS + "a great film\t7\n",
    "answer_outside.json": squad("dog", 40),
    "answer_mismatch.json": squad("dog", 4),
    "truncated.json": squad("cat", 4)[:50],
    "ragged.conll": CONLL_GOOD + "EU\nrejects VBZ B-VP O\n\n",
    "short_row.conll": CONLL_GOOD + "EU NNP\nrejects VBZ B-VP O\n\n",
    "unknown_tag.conll": CONLL_GOOD + "EU NNP B-NP B-XYZ\n\n",
    "typo.gin": "include 'configs/smoke.gin'\nTrainerConfig.train_stepz = 10\n",
    "syntax.gin": "include 'configs/smoke.gin'\nTrainerConfig.train_steps = = 3\n",
    "unknown.gin": "include 'configs/smoke.gin'\nNoSuchConfig.value = 3\n",
    "a_file": "not a directory\n",
    "lines.txt": "one line of text\n",
    "bad.jsonl": '{"text": "fine"}\nnot json\n',
}


FT = ["finetune", "--init_checkpoint={pretrained}", "--model_dir={existing}", "--seq_length=32",
      "--batch_size=8"]
SST2 = [*FT, "--task=sst2", "--train_steps=2", "--eval_file={good.tsv}"]
SQUAD = [*FT, "--task=squad", "--train_steps=2", "--eval_file={good_squad.json}",
         "--gin_param=SquadConfig.max_query_length = 8", "--gin_param=SquadConfig.doc_stride = 8"]
CONLL = [*FT, "--task=conll2003", "--train_steps=2", "--eval_file={good.conll}"]
PRETRAIN = ["pretrain", "--gin_file=configs/smoke.gin", "--model_dir={existing}",
            "--gin_param=build_encoder.vocab_size = 3000", "--train_data={lines.txt}",
            "--vocab_file={vocab}"]

ARCHITECTURE = "holds a checkpoint of another architecture: "
CLI_CASES = [
    ("unknown flag", ["pretrain", "--no_such_flag=1"],
     "error: Unknown command line flag 'no_such_flag'"),
    ("unknown subcommand", ["pretrian"], "unknown subcommand 'pretrian'; choose one of: "),
    ("gin typo", [*PRETRAIN, "--gin_file={typo.gin}"],
     "{typo.gin}:2: Configurable 'TrainerConfig' doesn't have a parameter named 'train_stepz'"),
    ("gin syntax error", [*PRETRAIN, "--gin_file={syntax.gin}"],
     "{syntax.gin}:2: Unable to parse value."),
    ("gin unknown configurable", [*PRETRAIN, "--gin_file={unknown.gin}"],
     "{unknown.gin}:2: No configurable matching 'NoSuchConfig'."),
    ("gin file missing", [*PRETRAIN, "--gin_file={root}/nope.gin"],
     "--gin_file={root}/nope.gin does not exist"),
    ("gin_param typo", [*PRETRAIN, "--gin_param=TrainerConfig.train_stepz = 3"],
     "--gin_param 'TrainerConfig.train_stepz = 3' (line 1): Configurable 'TrainerConfig' "
     "doesn't have a parameter named 'train_stepz'"),
    ("pretrain zero steps", [*PRETRAIN, "--gin_param=TrainerConfig.train_steps = 0"],
     "TrainerConfig: train_steps=0 must be a positive integer"),
    ("pretrain negative steps", [*PRETRAIN, "--gin_param=TrainerConfig.train_steps = -5"],
     "TrainerConfig: train_steps=-5 must be a positive integer"),
    ("pretrain zero batch", [*PRETRAIN, "--gin_param=PretrainingConfig.train_batch_size = 0"],
     "PretrainingConfig.train_batch_size=0 must be >= 1"),
    ("pretrain negative batch",
     [*PRETRAIN, "--gin_param=PretrainingConfig.train_batch_size = -16"],
     "PretrainingConfig.train_batch_size=-16 must be >= 1"),
    ("pretrain train_data matches nothing",
     [*PRETRAIN, "--model_dir={fresh}", "--train_data={root}/none-*.tfrecord"],
     "{root}/none-*.tfrecord"),
    ("pretrain train_data not TFRecord", [*PRETRAIN, "--model_dir={fresh}"], "{lines.txt}"),
    ("pretrain vocab without [CLS]", [*PRETRAIN, "--vocab_file={no_cls_vocab.txt}"],
     "vocab file {no_cls_vocab.txt} lacks the special tokens [CLS]"),
    ("pretrain checkpoint of another size",
     [*PRETRAIN, "--model_dir={pretraining_run}", "--gin_param=build_encoder.hidden_size = 64"],
     "model_dir {pretraining_run} " + ARCHITECTURE),
    ("pretrain model_dir is a file", [*PRETRAIN, "--model_dir={a_file}"],
     "--model_dir={a_file}: {a_file} is a file; give a directory"),
    ("pretrain model_dir under a file", [*PRETRAIN, "--model_dir={a_file}/run"],
     "--model_dir={a_file}/run: {a_file} is a file; give a directory"),
    ("pretrain no model_dir", ["pretrain", "--gin_file=configs/smoke.gin"],
     "--model_dir is required"),
    ("finetune unknown task", [*FT, "--task=sst3"], "unknown task 'sst3'; choose one of: "),
    ("finetune missing train_file", [*SST2, "--train_file={missing}"],
     "input file {missing} does not exist"),
    ("finetune empty train_file", [*SST2, "--train_file={empty.tsv}"],
     "input file {empty.tsv} is empty"),
    ("finetune binary train_file", [*SST2, "--train_file={binary.tsv}"],
     "{binary.tsv}:1: header has no column 'sentence'"),
    ("finetune non-UTF-8 train_file", [*SST2, "--train_file={latin1.tsv}"],
     "{latin1.tsv}:26: not UTF-8 (byte 0xe9 at byte offset 369); re-save the file as UTF-8"),
    ("finetune TSV row with too few columns", [*SST2, "--train_file={columns.tsv}"],
     "{columns.tsv}:26: expected at least 2 columns, found 1"),
    ("finetune TSV row with an extra column", [*SST2, "--train_file={extra_column.tsv}"],
     "{extra_column.tsv}:26: label 'b' is not in the label set ['negative', 'positive']"),
    ("finetune label outside the label set", [*SST2, "--train_file={label.tsv}"],
     "{label.tsv}:26: label '7' is not in the label set ['negative', 'positive']"),
    ("finetune unknown text column",
     [*FT, "--task=classification", "--train_file={good.tsv}", "--text_column=review"],
     "{good.tsv}:1: header has no column 'review' (it has ['sentence', 'label'])"),
    ("squad answer outside the context",
     [*SQUAD, "--train_file={answer_outside.json}", "--model_dir={fresh}"],
     "{answer_outside.json}"),
    ("squad answer text not at answer_start",
     [*SQUAD, "--train_file={answer_mismatch.json}", "--model_dir={fresh}"],
     "{answer_mismatch.json}"),
    ("squad truncated JSON", [*SQUAD, "--train_file={truncated.json}", "--model_dir={fresh}"],
     "{truncated.json}"),
    ("conll ragged columns", [*CONLL, "--train_file={ragged.conll}", "--model_dir={fresh}"],
     "{ragged.conll}:7: expected a word and a tag (>= 2 columns), found 1"),
    ("conll short row", [*CONLL, "--train_file={short_row.conll}", "--model_dir={fresh}"],
     "{short_row.conll}:7"),
    ("conll tag outside the tag set",
     [*CONLL, "--train_file={unknown_tag.conll}", "--model_dir={fresh}"],
     "{unknown_tag.conll}:7"),
    ("finetune vocab without [CLS]",
     [*SST2, "--train_file={good.tsv}", "--vocab_file={no_cls_vocab.txt}"],
     "vocab file {no_cls_vocab.txt} lacks the special tokens [CLS]"),
    ("finetune seq_length over max_sequence_length",
     [*SST2, "--train_file={good.tsv}", "--seq_length=1024"],
     "seq_length=1024 exceeds the encoder's max_sequence_length=64 "
     "(--init_checkpoint={pretrained}); use --seq_length <= 64"),
    ("finetune zero batch", [*SST2, "--train_file={good.tsv}", "--batch_size=0"],
     "flag --batch_size=0: 0 is not a positive integer"),
    ("predict zero length window",
     ["predict", "--model_dir={existing}", "--input={lines.txt}", "--window_batches=0"],
     "flag --window_batches=0: 0 is not a positive integer"),
    ("finetune negative batch", [*SST2, "--train_file={good.tsv}", "--batch_size=-8"],
     "flag --batch_size=-8: -8 is not a positive integer"),
    ("finetune zero steps", [*SST2, "--train_file={good.tsv}", "--train_steps=0"],
     "TrainerConfig: train_steps=0 must be a positive integer"),
    ("finetune negative steps", [*SST2, "--train_file={good.tsv}", "--train_steps=-3"],
     "TrainerConfig: train_steps=-3 must be a positive integer"),
    ("finetune negative epochs",
     [*FT, "--task=sst2", "--train_file={good.tsv}", "--eval_file={good.tsv}",
      "--num_epochs=-1"], "num_epochs=-1.0 must be > 0"),
    ("finetune init_checkpoint missing",
     [*SST2, "--train_file={good.tsv}", "--init_checkpoint={root}/no_model"],
     "--init_checkpoint={root}/no_model does not exist"),
    ("finetune init_checkpoint truncated",
     [*SST2, "--train_file={good.tsv}", "--init_checkpoint={truncated_model}",
      "--model_dir={fresh}"], "{truncated_model}/ckpt-3"),
    ("finetune init_checkpoint pickle .bin",
     [*SST2, "--train_file={good.tsv}", "--init_checkpoint={pickle_model}"],
     "{pickle_model}/pytorch_model.bin is a pickle (loading it can run arbitrary code)"),
    ("finetune model_dir holds another model",
     [*SST2, "--train_file={good.tsv}", "--model_dir={pretraining_run}"],
     "model_dir {pretraining_run} " + ARCHITECTURE),
    ("finetune model_dir with truncated checkpoints",
     [*SST2, "--train_file={good.tsv}", "--model_dir={broken_run}"],
     "{broken_run}/checkpoint lists 1 checkpoint(s) and none is usable (ckpt-2.data holds "),
    ("finetune model_dir is a file", [*SST2, "--train_file={good.tsv}", "--model_dir={a_file}"],
     "--model_dir={a_file}: {a_file} is a file; give a directory"),
    ("evaluate missing model_dir", ["evaluate", "--model_dir={root}/nowhere"],
     "--model_dir={root}/nowhere does not exist"),
    ("evaluate model_dir without a task", ["evaluate", "--model_dir={pretraining_run}"],
     "{pretraining_run}/bert_train.json names no task"),
    ("evaluate eval_file with a bad label",
     ["evaluate", "--model_dir={existing}", "--eval_file={label.tsv}"],
     "{label.tsv}:26: label '7' is not in the label set"),
    ("evaluate truncated checkpoints",
     ["evaluate", "--model_dir={broken_run}", "--eval_file={good.tsv}"],
     "{broken_run}/checkpoint lists 1 checkpoint(s) and none is usable"),
    ("vocab missing input", ["vocab", "--input={missing}", "--output={root}/v1.txt"],
     "--input: '{missing}' matches no file"),
    ("vocab non-UTF-8 input", ["vocab", "--input={latin1.txt}", "--output={root}/v2.txt"],
     "{latin1.txt}: line 1 is not UTF-8"),
    ("vocab binary input", ["vocab", "--input={binary.tsv}", "--output={root}/v3.txt"],
     "{binary.tsv}: line 2 is not UTF-8"),
    ("vocab zero size",
     ["vocab", "--input={lines.txt}", "--output={root}/v4.txt", "--vocab_size=0"],
     "--vocab_size=0 must exceed the 5 special tokens"),
    ("create_pretraining_data vocab without [CLS]",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={no_cls_vocab.txt}",
      "--output={root}/d1-*.tfrecord"],
     "vocab file {no_cls_vocab.txt} lacks the special tokens [CLS]"),
    ("create_pretraining_data empty input",
     ["create_pretraining_data", "--input={empty.tsv}", "--vocab={vocab}",
      "--output={root}/d2-*.tfrecord"], "--input={empty.tsv} produced no examples"),
    ("create_pretraining_data max_seq_length too small",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={root}/d3-*.tfrecord", "--max_seq_length=2"],
     "--max_seq_length=2 is too short"),
    ("create_pretraining_data output without *",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={root}/d4.tfrecord"], "--output={root}/d4.tfrecord must hold exactly one '*'"),
]
# In subprocesses, one per command: predict's and export's --model_dir clash with the training
# commands' in one process, and convert marks --input/--output as required for every command.
SUBPROCESS_CASES = [
    ("convert pickle .bin", ["convert", "--input={pickle_model}", "--output={root}/conv1"],
     "{pickle_model}/pytorch_model.bin is a pickle (loading it can run arbitrary code)"),
    ("convert config.json not JSON",
     ["convert", "--input={bad_config_model}", "--output={root}/conv2"],
     "{bad_config_model}/config.json is not valid JSON"),
    ("convert garbage safetensors",
     ["convert", "--input={garbage_weights_model}", "--output={root}/conv3"],
     "{garbage_weights_model}/model.safetensors could not be read as safetensors"),
    ("convert missing input", ["convert", "--input={root}/no_model", "--output={root}/conv4"],
     "{root}/no_model does not exist"),
    ("convert output is a file", ["convert", "--input={pretrained}", "--output={a_file}"],
     "--output={a_file} is a file"),
    ("predict missing input", ["predict", "--model_dir={existing}", "--input={missing}"],
     "--input={missing} does not exist"),
    ("predict bad JSON line",
     ["predict", "--model_dir={existing}", "--input={bad.jsonl}", "--on_error=stop"],
     "{bad.jsonl}:2"),
    ("predict model_dir without a task",
     ["predict", "--model_dir={pretraining_run}", "--input={lines.txt}"],
     "{pretraining_run} is a pretraining model directory: it has no task to predict"),
    ("predict zero batch",
     ["predict", "--model_dir={existing}", "--input={lines.txt}", "--batch_size=0"],
     "flag --batch_size=0: 0 is not a positive integer"),
    ("predict zero length window",
     ["predict", "--model_dir={existing}", "--input={lines.txt}", "--window_batches=0"],
     "flag --window_batches=0: 0 is not a positive integer"),
    ("export output is a file", ["export", "--model_dir={existing}", "--output={a_file}"],
     "--output={a_file} is a file"),
    ("export truncated checkpoint",
     ["export", "--model_dir={broken_run}", "--output={root}/exp2"], "{broken_run}"),
]


# ------------------------------------------------------------------ outputs (OUTPUT_CASES)
# Commands that would replace or write into something they do not own, or that refuse their
# input with an existing output in place. Each is refused with one line, and every file of the
# guarded directories (test_bad_inputs.py's GUARDED and `outputs_root`, which holds the files
# named here) keeps its sha256; no temporary is left behind. Paths under {outputs_root}:
#   old.jsonl      predictions of an earlier predict run      notes.txt     a user's file
#   my_vocab.txt   a vocabulary written by vocab
#   mixed_export/  saved_model.pb + notes.txt (not only a SavedModel)
#   data/          a shard set + train-summary.json made by create_pretraining_data
#   mixed_data/    a shard set and train-notes.tfrecord;  odd_summary/  shards + a user's JSON
# {existing_parent} is the directory holding the fine-tuned model_dir {existing}.
OUTPUT_CASES = [
    ("predict refuses its input, the old output stays",
     ["predict", "--model_dir={existing}", "--input={bad.jsonl}", "--on_error=stop",
      "--output={outputs_root}/old.jsonl", "--overwrite"], "{bad.jsonl}:2"),
    ("predict existing output without --overwrite",
     ["predict", "--model_dir={existing}", "--input={lines.txt}",
      "--output={outputs_root}/old.jsonl"],
     "--output={outputs_root}/old.jsonl exists; choose another path or pass --overwrite"),
    ("predict --overwrite of a file that is not predictions",
     ["predict", "--model_dir={existing}", "--input={lines.txt}",
      "--output={outputs_root}/notes.txt", "--overwrite"],
     "--output={outputs_root}/notes.txt is not a predictions file"),
    ("predict output inside a model_dir",
     ["predict", "--model_dir={existing}", "--input={lines.txt}",
      "--output={existing}/predictions.jsonl"],
     "--output={existing}/predictions.jsonl is inside the model directory {existing}"),
    ("export --overwrite onto the model_dir",
     ["export", "--model_dir={existing}", "--output={existing}", "--overwrite"],
     "--output={existing} is the --model_dir directory; write to a new directory"),
    ("export --overwrite onto the model_dir's parent",
     ["export", "--model_dir={existing}", "--output={existing_parent}", "--overwrite"],
     "--output={existing_parent} contains --model_dir={existing}"),
    ("export into the model_dir",
     ["export", "--model_dir={existing}", "--output={existing}/export"],
     "--output={existing}/export is inside --model_dir={existing}"),
    ("export into another model_dir",
     ["export", "--model_dir={existing}", "--output={pretraining_run}/export"],
     "--output={pretraining_run}/export is inside the model directory {pretraining_run}"),
    ("export --overwrite of a directory holding more than a SavedModel",
     ["export", "--model_dir={existing}", "--output={outputs_root}/mixed_export", "--overwrite"],
     "--output={outputs_root}/mixed_export holds notes.txt, saved_model.pb (not a SavedModel "
     "written by bert-train export)"),
    ("vocab existing output without --overwrite",
     ["vocab", "--input={lines.txt}", "--output={outputs_root}/my_vocab.txt"],
     "--output={outputs_root}/my_vocab.txt exists; choose another path or pass --overwrite"),
    ("vocab --overwrite of a file that is not a vocabulary",
     ["vocab", "--input={lines.txt}", "--output={outputs_root}/notes.txt", "--overwrite"],
     "--output={outputs_root}/notes.txt is not a WordPiece vocabulary"),
    ("vocab --overwrite of a model's vocab.txt",
     ["vocab", "--input={lines.txt}", "--output={existing}/vocab.txt", "--overwrite"],
     "--output={existing}/vocab.txt is inside the model directory {existing}"),
    ("convert --overwrite onto a fine-tuned model_dir",
     ["convert", "--input={pretrained}", "--output={existing}", "--overwrite"],
     "--output={existing} holds batch_plan.json, bert_train.json, best/"),
    ("convert into a model_dir",
     ["convert", "--input={pretrained}", "--output={pretraining_run}/hf", "--to=hf"],
     "--output={pretraining_run}/hf is inside the model directory {pretraining_run}"),
    ("convert into its input",
     ["convert", "--input={pretrained}", "--output={pretrained}/converted"],
     "--output={pretrained}/converted is inside --input={pretrained}"),
    ("create_pretraining_data into a model_dir",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={existing}/d-*.tfrecord"],
     "--output={existing}/d-*.tfrecord is inside the model directory {existing}"),
    ("create_pretraining_data existing shards without --overwrite",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={outputs_root}/data/train-*.tfrecord"],
     "--output={outputs_root}/data/train-*.tfrecord already matches 2 file(s)"),
    ("create_pretraining_data --overwrite of files that are not shards",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={outputs_root}/mixed_data/train-*.tfrecord", "--overwrite"],
     "train-notes.tfrecord (not pretraining data written by bert-train create_pretraining_data)"),
    ("create_pretraining_data --overwrite of a summary it did not write",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={outputs_root}/odd_summary/train-*.tfrecord", "--overwrite"],
     "train-summary.json (not pretraining data written by bert-train create_pretraining_data)"),
    ("create_pretraining_data --overwrite, input fails mid-run: the old set stays",
     ["create_pretraining_data", "--input={latin1.txt}", "--vocab={vocab}",
      "--output={outputs_root}/data/train-*.tfrecord", "--overwrite"], "{latin1.txt}"),
]


# --------------------------------------------------------------------------------------------
# A model_dir belongs to one run (tests/cli/test_bad_inputs.py::test_model_dir_is_not_reused): a
# resume as another task, label set, sequence length or vocabulary of the fine-tuned sst2 run
# {existing} is refused before anything is written; {locked_run} is held by a live process.
SST2_AGAIN = [*SST2, "--train_file={good.tsv}"]
MODEL_DIR_CASES = [
    ("finetune resumes as another task", [*CONLL, "--train_file={good.conll}"],
     "--model_dir={existing} was trained as task 'sst2' (labels ['negative', 'positive']); "
     "this run asks for task 'conll2003' (labels "),
    ("finetune resumes with other labels", [*SST2_AGAIN, "--label_names=bad,good"],
     "--model_dir={existing} was trained as task 'sst2' (labels ['negative', 'positive']) with "
     "label_names=['negative', 'positive']; this run asks for label_names=['bad', 'good']; use "
     "another --model_dir"),
    ("finetune resumes with another seq_length", [*SST2_AGAIN, "--seq_length=16"],
     "with seq_length=32; this run asks for seq_length=16; use another --model_dir"),
    ("finetune resumes with another vocabulary", [*SST2_AGAIN, "--vocab_file={swapped_vocab}"],
     "--model_dir={existing} was trained with the vocabulary {existing}/vocab.txt; this run's "
     "{swapped_vocab} differs from it; use another --model_dir"),
    ("finetune resumes with another casing", [*SST2_AGAIN, "--nolower_case"],
     "--model_dir={existing} was trained with lower_case=True; this run asks for "
     "lower_case=False"),
    ("pretrain resumes a fine-tuned model_dir", PRETRAIN,
     "--model_dir={existing} was trained as task 'sst2' (labels ['negative', 'positive']); "
     "this run asks for task 'pretraining'"),
    ("finetune in a model_dir in use", [*SST2_AGAIN, "--model_dir={locked_run}"],
     "--model_dir={locked_run} is in use by bert-train finetune (pid "),
    ("pretrain in a model_dir in use", [*PRETRAIN, "--model_dir={locked_run}"],
     "--model_dir={locked_run} is in use by bert-train finetune (pid "),
]


# ------------------------------------------------------------------------------------------
# Checked before the first step: what finetune/evaluate can know before training is refused
# before a model_dir is created ({fresh}) or anything is built.
# ------------------------------------------------------------------------------------------
REGRESSION_ROWS = "".join(f"a {w} film\t{i * 0.5}\n" for i, w in enumerate(
    ["fine", "bad", "great", "dull"] * 3))


def squad_v2() -> str:
    """A SQuAD v2.0 file: one answerable question, then one unanswerable (q2)."""
    qas = [{"id": "q1", "question": "Who sat?", "answers": [{"text": "cat", "answer_start": 4}]},
           {"id": "q2", "question": "Who flew?", "answers": [], "is_impossible": True}]
    return json.dumps({"version": "v2.0", "data": [
        {"title": "t", "paragraphs": [{"context": SQUAD_CONTEXT, "qas": qas}]}]})


# Written by test_bad_inputs.py's `precheck_paths` fixture; a_dir is made as a directory.
PRECHECK_FILES = {
    "scores.tsv": SST2_HEADER + REGRESSION_ROWS,
    "nan_score.tsv": SST2_HEADER + REGRESSION_ROWS + "a nan film\tnan\n",
    "inf_score.tsv": SST2_HEADER + REGRESSION_ROWS + "an inf film\t-Infinity\n",
    "squad_v2.json": squad_v2(),
}
FRESH = [*FT, "--model_dir={fresh}", "--train_steps=2"]
OWN = [*FRESH, "--task=classification", "--text_column=sentence", "--train_file={good.tsv}"]
REGRESSION = [*FRESH, "--task=regression", "--text_column=sentence"]
SQUAD_FRESH = [*SQUAD, "--model_dir={fresh}"]
SST2_FRESH = [*SST2, "--model_dir={fresh}", "--train_file={good.tsv}"]
PRECHECK_CASES = [
    ("finetune own task without an eval source", OWN,
     "--task=classification has no TFDS dataset to evaluate on; pass --eval_file"),
    ("finetune NaN regression label in train_file",
     [*REGRESSION, "--train_file={nan_score.tsv}", "--eval_file={scores.tsv}"],
     "{nan_score.tsv}:14: label 'nan' is not a finite number"),
    ("finetune infinite regression label in eval_file",
     [*REGRESSION, "--train_file={scores.tsv}", "--eval_file={inf_score.tsv}"],
     "{inf_score.tsv}:14: label '-Infinity' is not a finite number"),
    ("finetune duplicate label_names", [*OWN, "--eval_file={good.tsv}", "--label_names=0,1,0"],
     "--label_names lists '0' twice; class names must be unique"),
    ("finetune empty label name", [*OWN, "--eval_file={good.tsv}", "--label_names=0,,1"],
     "--label_names holds an empty name"),
    ("squad task given a SQuAD v2 train_file", [*SQUAD_FRESH, "--train_file={squad_v2.json}"],
     "{squad_v2.json}: question q2 is unanswerable (SQuAD v2); use --task=squad_v2"),
    ("squad task given a SQuAD v2 eval_file",
     [*SQUAD_FRESH, "--train_file={good_squad.json}", "--eval_file={squad_v2.json}"],
     "{squad_v2.json}: question q2 is unanswerable (SQuAD v2); use --task=squad_v2"),
    ("finetune train_file is a directory", [*SST2_FRESH, "--train_file={a_dir}"],
     "--train_file={a_dir} is a directory; give a file"),
    ("finetune eval_file is a directory", [*SST2_FRESH, "--eval_file={a_dir}"],
     "--eval_file={a_dir} is a directory; give a file"),
    ("finetune vocab_file is a directory", [*SST2_FRESH, "--vocab_file={a_dir}"],
     "--vocab_file={a_dir} is a directory; give a file"),
    ("evaluate eval_file is a directory",
     ["evaluate", "--model_dir={existing}", "--eval_file={a_dir}"],
     "--eval_file={a_dir} is a directory; give a file"),
    ("finetune learning_rate NaN", [*SST2_FRESH, "--learning_rate=nan"],
     "flag --learning_rate=nan: must be a finite number"),
    ("finetune learning_rate infinite", [*SST2_FRESH, "--learning_rate=inf"],
     "flag --learning_rate=inf: must be a finite number"),
    ("finetune num_epochs infinite", [*FT, "--model_dir={fresh}", "--task=sst2",
                                      "--train_file={good.tsv}", "--eval_file={good.tsv}",
                                      "--num_epochs=inf"],
     "flag --num_epochs=inf: must be a finite number"),
    ("finetune num_epochs infinite through gin",
     [*FT, "--model_dir={fresh}", "--task=sst2", "--train_file={good.tsv}",
      "--eval_file={good.tsv}", "--gin_param=FinetuneConfig.num_epochs = 1e999"],
     "num_epochs=inf must be > 0 and finite"),
    ("create_pretraining_data masked_lm_prob NaN",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={root}/d5-*.tfrecord", "--masked_lm_prob=nan"],
     "flag --masked_lm_prob=nan: must be a finite number"),
]


# ------------------------------------------------------------------------------------------
# Multi-seed runs (finetune --seeds / --num_seeds): bad seed flags, and a multi-seed run asked
# into a single-seed run's model_dir, are refused before anything is written.
# ------------------------------------------------------------------------------------------
SEED_CASES = [
    ("finetune negative seed", [*SST2_FRESH, "--seeds=1,-2"],
     "--seeds=1,-2: '-2' is not a seed; give integers >= 0, e.g. --seeds=1,2,3"),
    ("finetune seed not an integer", [*SST2_FRESH, "--seeds=1,2.5"],
     "--seeds=1,2.5: '2.5' is not a seed"),
    ("finetune duplicate seed", [*SST2_FRESH, "--seeds=3,1,3"],
     "--seeds=3,1,3 lists 3 twice; each seed runs once"),
    ("finetune seeds and num_seeds", [*SST2_FRESH, "--seeds=1,2", "--num_seeds=2"],
     "--seeds and --num_seeds are exclusive"),
    ("finetune zero num_seeds", [*SST2_FRESH, "--num_seeds=0"],
     "--num_seeds=0 must be >= 1 (it runs the seeds 1..N)"),
    ("finetune seeds with a bound seed", [*SST2_FRESH, "--num_seeds=2",
                                          "--gin_param=TrainerConfig.seed = 7"],
     "TrainerConfig.seed is bound, but --seeds/--num_seeds set it for each seed's run; drop "
     "the binding"),
    ("finetune seeds without evaluation", [*SST2_FRESH, "--seeds=1,2",
                                           "--gin_param=TrainerConfig.eval_steps = 0"],
     "--seeds/--num_seeds report evaluation metrics, but TrainerConfig.eval_steps = 0 turns "
     "evaluation off"),
    ("finetune seeds into a single-seed run", [*SST2_AGAIN, "--seeds=1,2"],
     "--model_dir={existing} holds a single-seed finetune run (bert_train.json, checkpoints); a "
     "multi-seed run needs its own --model_dir"),
]


# ------------------------------------------------------------------------------------------
# Batch fitting (--micro_batch_size, TrainerConfig.fit_batch): refused before anything is
# written (test_bad_inputs.py `test_finetune_options_refused_before_anything_is_written`).
# ------------------------------------------------------------------------------------------
BATCH_FIT_CASES = [
    ("finetune micro_batch_size not dividing the batch", [*SST2_FRESH, "--micro_batch_size=3"],
     "micro_batch_size=3 must divide the per-replica batch 8 (batch 8 over 1 replica(s)); "
     "choose one of 8, 4, 2, 1"),
    ("finetune micro_batch_size above the batch", [*SST2_FRESH, "--micro_batch_size=16"],
     "micro_batch_size=16 must divide the per-replica batch 8"),
    ("finetune micro_batch_size zero", [*SST2_FRESH, "--micro_batch_size=0"],
     "micro_batch_size=0 must be a positive integer"),
    ("finetune fit_batch not a boolean", [*SST2_FRESH, "--gin_param=TrainerConfig.fit_batch=2"],
     "fit_batch=2 must be True or False"),
]


# ------------------------------------------------------------------------------------------
# Long texts: the windowing flags and FinetuneConfig fields (tests/cli/test_bad_inputs.py
# test_finetune_options_refused_before_anything_is_written).
# ------------------------------------------------------------------------------------------
CONLL_FRESH = [*CONLL, "--model_dir={fresh}", "--train_file={good.conll}"]
WINDOW_CASES = [
    ("finetune window_pooling for tagging", [*CONLL_FRESH, "--window_pooling=max"],
     "--window_pooling applies to classification and regression, not to tagging tasks"),
    ("finetune long_texts=truncate for squad",
     [*SQUAD_FRESH, "--train_file={good_squad.json}", "--long_texts=truncate"],
     "--long_texts=truncate does not apply to squad tasks: their texts are always windowed"),
    ("finetune doc_stride 0", [*SST2_FRESH, "--doc_stride=0"],
     "flag --doc_stride=0: 0 is not a positive integer"),
    ("finetune unknown long_texts", [*SST2_FRESH, "--long_texts=wrap"],
     "flag --long_texts=wrap: value should be one of <windows|truncate|head_tail>"),
    ("finetune long_texts=head_tail for tagging", [*CONLL_FRESH, "--long_texts=head_tail"],
     "--long_texts=head_tail applies to classification and regression tasks, not to tagging; "
     "use windows or truncate"),
    ("finetune long_texts=head_tail for a pair",
     [*SST2_FRESH, "--text_b_column=sentence", "--long_texts=head_tail"],
     "FinetuneConfig.long_texts='head_tail' keeps the head and tail of one text; task 'sst2' "
     "reads pairs: use windows or truncate"),
    ("finetune long_texts=head_tail for tagging through gin",
     [*CONLL_FRESH, "--gin_param=FinetuneConfig.long_texts = 'head_tail'"],
     "FinetuneConfig.long_texts='head_tail' would cut words out of the middle of a tagged "
     "sentence; tagging uses windows or truncate"),
    ("finetune doc_stride 0 through gin",
     [*SST2_FRESH, "--gin_param=FinetuneConfig.doc_stride = 0"],
     "FinetuneConfig.doc_stride=0 must be an integer >= 1"),
    ("finetune unknown window_pooling through gin",
     [*SST2_FRESH, "--gin_param=FinetuneConfig.window_pooling = 'sum'"],
     "FinetuneConfig.window_pooling='sum' is unknown; use one of mean, max"),
]


# ------------------------------------------------------------------------------------------
# Task family plugins: a --family_module that cannot be imported (tests/cli/test_bad_inputs.py
# test_a_missing_family_module_is_refused_before_anything_is_written).
# ------------------------------------------------------------------------------------------
_NO_PLUGIN = "--family_module=no_such_family_plugin"
_NO_PLUGIN_LINE = "--family_module: cannot import the task family module 'no_such_family_plugin'"
FAMILY_CASES = [
    ("finetune family module missing", [*SST2_FRESH, _NO_PLUGIN], _NO_PLUGIN_LINE),
    ("export family module missing",
     ["export", "--model_dir={existing}", "--output={fresh}", _NO_PLUGIN], _NO_PLUGIN_LINE),
    ("predict family module missing",
     ["predict", "--model_dir={existing}", "--input={lines.txt}", _NO_PLUGIN], _NO_PLUGIN_LINE),
    ("evaluate family module missing", ["evaluate", "--model_dir={existing}", _NO_PLUGIN],
     _NO_PLUGIN_LINE),
]


# ------------------------------------------------------------------------------------------
# `vocab --columns`: pair files (tests/cli/test_bad_inputs.py
# test_vocab_refuses_bad_pair_files_before_writing; placeholders are VOCAB_PAIR_FILES and
# {out}, a directory that must still not exist afterwards).
# ------------------------------------------------------------------------------------------
VOCAB_PAIR_FILES = {
    "pairs.tsv": "english\tspanish\nWhere is it?\t¿Dónde está?\n",
    "pairs_empty.tsv": "",
    "pairs_header_only.tsv": "english\tspanish\n",
    "pairs_one_column.tsv": "Hi.\tHola.\nalone\n",
    "pairs_missing_key.jsonl": '{"en": "Hi."}\n',
    "pairs.conll": "EU B-ORG\n",
}
_PAIR_VOCAB = ["vocab", "--output={out}/vocab.txt", "--lower_case=false"]
VOCAB_PAIR_CASES = [
    ("vocab pairs missing column",
     [*_PAIR_VOCAB, "--input={pairs.tsv}", "--columns=english,french"],
     "{pairs.tsv}:1: header has no column 'french' (it has ['english', 'spanish'])"),
    ("vocab pairs empty file",
     [*_PAIR_VOCAB, "--input={pairs_empty.tsv}", "--columns=english,spanish"],
     "input file {pairs_empty.tsv} is empty"),
    ("vocab pairs header only",
     [*_PAIR_VOCAB, "--input={pairs_header_only.tsv}", "--columns=english,spanish"],
     "{pairs_header_only.tsv} holds no examples"),
    ("vocab pairs one column",
     [*_PAIR_VOCAB, "--input={pairs_one_column.tsv}", "--columns=0,1"],
     "{pairs_one_column.tsv}:2: expected at least 2 columns, found 1"),
    ("vocab pairs JSONL key missing",
     [*_PAIR_VOCAB, "--input={pairs_missing_key.jsonl}", "--columns=en,es"],
     "{pairs_missing_key.jsonl}:1: object lacks the keys ['es']"),
    ("vocab pairs JSONL indices",
     [*_PAIR_VOCAB, "--input={pairs_missing_key.jsonl}", "--columns=0,1"],
     "JSONL rows are objects; give --columns as their keys"),
    ("vocab pairs not a table", [*_PAIR_VOCAB, "--input={pairs.conll}", "--columns=0,1"],
     "--columns reads TSV, CSV or JSONL files"),
    ("vocab pairs three columns", [*_PAIR_VOCAB, "--input={pairs.tsv}", "--columns=a,b,c"],
     "--columns=a,b,c must name one or two columns"),
    ("vocab pairs no columns", [*_PAIR_VOCAB, "--input={pairs.tsv}", "--columns="],
     "--columns= must name one or two columns"),
]


# ------------------------------------------------------------------------------------------
# Translation (tests/cli/test_bad_inputs.py test_translate_bad_input_refused_before_anything_is_
# written): pair files and the translate options. TRANSLATE_FILES are written beside the
# sweep's files.
# ------------------------------------------------------------------------------------------
TRANSLATE_FILES = {
    "tr_pairs.tsv": "english\tspanish\n" + "Go.\tVe.\nHi.\tHola.\nRun!\t¡Corre!\n" * 4,
    "tr_pairs_one_column.tsv": "Go.\nHi.\nRun!\n",
    "tr_pairs_empty_target.tsv": "english\tspanish\nGo.\tVe.\nHi.\t \nRun!\t¡Corre!\n",
}
TRANSLATE = ["finetune", "--task=translate", "--init_checkpoint={pretrained}",
             "--model_dir={fresh}", "--seq_length=32", "--batch_size=4", "--train_steps=2",
             "--train_file={tr_pairs.tsv}", "--eval_file={tr_pairs.tsv}"]
TRANSLATE_CASES = [
    ("translate pair file with one column", [*TRANSLATE, "--train_file={tr_pairs_one_column.tsv}"],
     "{tr_pairs_one_column.tsv}:1: one column; a translate file holds a source and a target "
     "column"),
    ("translate empty target", [*TRANSLATE, "--train_file={tr_pairs_empty_target.tsv}"],
     "{tr_pairs_empty_target.tsv}:3: empty target; every pair needs a source and a target text"),
    ("translate empty target in the eval file",
     [*TRANSLATE, "--eval_file={tr_pairs_empty_target.tsv}"],
     "{tr_pairs_empty_target.tsv}:3: empty target"),
    ("translate missing source column", [*TRANSLATE, "--source_column=french"],
     "{tr_pairs.tsv}:1: header has no column 'french'"),
    ("translate target column out of range", [*TRANSLATE, "--target_column=7"],
     "{tr_pairs.tsv}:1: expected at least 8 columns, found 2"),
    ("translate source longer than the positions", [*TRANSLATE, "--seq_length=128"],
     "seq_length=128 exceeds the encoder's max_sequence_length=64"),
    ("translate target longer than the positions",
     [*TRANSLATE, "--gin_param=TranslateConfig.max_target_length = 128"],
     "TranslateConfig.max_target_length=128 exceeds the encoder's max_sequence_length=64"),
    ("translate classification column flag", [*TRANSLATE, "--text_column=english"],
     "--text_column does not apply to translate tasks; their columns are --source_column, "
     "--target_column"),
    ("classification translate column flag",
     [*SST2_FRESH, "--source_column=sentence"],
     "--source_column does not apply to classification tasks"),
    ("translate label smoothing out of range",
     [*TRANSLATE, "--gin_param=TranslateConfig.label_smoothing = 1.5"],
     "TranslateConfig.label_smoothing=1.5 must be in [0, 1)"),
    ("translate decode beyond the targets",
     [*TRANSLATE, "--gin_param=TranslateConfig.max_decode_length = 100"],
     "TranslateConfig.max_decode_length=100 exceeds max_target_length=64"),
]


# ------------------------------------------------------------------------------------------
# Hugging Face GPT-2 checkpoints (GPT2_CASES): {gpt2} is tests/data/gpt2_tiny, the other
# {gpt2_*} directories copies of it with one fault (test_bad_inputs.py `gpt2_paths`), and
# {gpt2_converted} its conversion to a bert-train model_dir (no vocabulary: GPT-2's BPE).
# ------------------------------------------------------------------------------------------
GPT2_CONVERT = ["convert", "--output={fresh}"]
GPT2_CASES = [
    ("gpt2 fine-tuned as a BERT encoder",
     ["finetune", "--task=sst2", "--init_checkpoint={gpt2}", "--model_dir={fresh}",
      "--train_file={sst2.tsv}", "--eval_file={sst2.tsv}", "--train_steps=2"],
     "--init_checkpoint={gpt2} is a GPT-2 (causal LM) checkpoint, not a BERT encoder"),
    ("gpt2 warm-starts masked-LM pretraining",
     ["pretrain", "--gin_file=configs/smoke.gin", "--model_dir={fresh}",
      "--train_data={sst2.tsv}", "--init_checkpoint={gpt2}"],
     "--init_checkpoint={gpt2} is a GPT-2 (causal LM) checkpoint; it warm-starts "
     "pretraining_objective.name = 'causal_lm', not masked LM"),
    ("gpt2 model generates text",
     ["generate", "--model_dir={gpt2_converted}", "--prompt=the cat"],
     "{gpt2_converted} is a GPT-2 model: it tokenizes with GPT-2's byte-level BPE, which "
     "bert-train cannot run"),
    ("gpt2 model exported", ["export", "--model_dir={gpt2_converted}", "--output={fresh}"],
     "{gpt2_converted} is a GPT-2 model: it tokenizes with GPT-2's byte-level BPE"),
    ("gpt2 converted to hf", [*GPT2_CONVERT, "--input={gpt2}", "--to=hf"],
     "--to=hf: a GPT-2 checkpoint converts to bert_train only"),
    ("gpt2 unsupported config field", [*GPT2_CONVERT, "--input={gpt2_inverse_layer_idx}"],
     "scale_attn_by_inverse_layer_idx=True (scores divided by the layer index) is not "
     "supported"),
    ("gpt2 other activation", [*GPT2_CONVERT, "--input={gpt2_swish}"],
     "activation_function 'swish' is not supported"),
    ("gpt2 pickle", [*GPT2_CONVERT, "--input={gpt2_pickle}"],
     "{gpt2_pickle}/pytorch_model.bin is a pickle (loading it can run arbitrary code)"),
    ("gpt2 missing tensor", [*GPT2_CONVERT, "--input={gpt2_missing}"],
     "lacks h.1.mlp.c_fc.bias (1 of 28 tensors missing)"),
    ("gpt2 wrong shape", [*GPT2_CONVERT, "--input={gpt2_shape}"],
     "h.0.attn.c_attn.weight has shape (32, 64) but the config implies (32, 96)"),
]


# ------------------------------------------------------------------------------------------
# Causal language modelling (tests/cli/test_bad_inputs.py test_causal_lm_bad_input_refused_before_
# anything_is_written): create_pretraining_data --objective=causal_lm (CAUSAL_DATA_CASES) and
# pretrain with the causal objective (CAUSAL_PRETRAIN_CASES). Extra placeholders (the
# `causal_paths` fixture): {causal_text} (60 short documents), {causal_blocks} (their blocks
# of 64 tokens), {mlm_records} (masked-LM examples), {causal_model} (a tiny CausalLM's model
# directory), {causal_out} (a directory nothing may appear in).
# ------------------------------------------------------------------------------------------
CAUSAL_DATA = ["create_pretraining_data", "--objective=causal_lm", "--input={lines.txt}",
               "--vocab={vocab}", "--output={causal_out}/blocks-*.tfrecord"]
CAUSAL_DATA_CASES = [
    ("causal data block_size 1", [*CAUSAL_DATA, "--block_size=1"],
     "--block_size=1 is too short: a block needs at least 2 tokens"),
    ("causal data block_size 0", [*CAUSAL_DATA, "--block_size=0"],
     "--block_size=0 is too short"),
    ("causal data block_size beyond any model", [*CAUSAL_DATA, "--block_size=100000"],
     "--block_size=100000 exceeds 65,536, longer than any model's positions"),
    ("causal data empty input", [*CAUSAL_DATA, "--input={empty.tsv}"],
     "--input={empty.tsv} produced no blocks: 0 documents make 0 tokens with separators, "
     "fewer than --block_size=256"),
    ("causal data input shorter than a block",
     [*CAUSAL_DATA, "--input={causal_text}", "--block_size=4096"],
     "--input={causal_text} produced no blocks: 60 documents make "),
    ("causal data masked-LM flag", [*CAUSAL_DATA, "--max_seq_length=64"],
     "--max_seq_length does not apply to --objective=causal_lm"),
    ("masked-LM data block_size flag",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={causal_out}/d-*.tfrecord", "--block_size=64"],
     "--block_size does not apply to --objective=masked_lm"),
    ("causal data unknown objective", [*CAUSAL_DATA, "--objective=gpt"],
     "flag --objective=gpt: value should be one of <masked_lm|causal_lm>"),
    ("causal data output without *",
     [*CAUSAL_DATA, "--output={causal_out}/blocks.tfrecord"],
     "--output={causal_out}/blocks.tfrecord must hold exactly one '*'"),
]
CAUSAL_PRETRAIN = ["pretrain", "--gin_file=configs/causal_lm/tiny.gin", "--model_dir={fresh}",
                   "--train_data={causal_blocks}", "--vocab_file={vocab}",
                   "--gin_param=build_causal_lm.vocab_size = 3000",
                   "--gin_param=build_causal_lm.hidden_size = 32",
                   "--gin_param=CausalLMConfig.block_size = 64",
                   "--gin_param=TrainerConfig.train_steps = 2"]
CAUSAL_PRETRAIN_CASES = [
    ("causal pretrain block_size beyond the positions",
     [*CAUSAL_PRETRAIN, "--gin_param=build_causal_lm.max_sequence_length = 32"],
     "CausalLMConfig.block_size=64 exceeds the model's max_sequence_length=32"),
    ("causal pretrain masked-LM records", [*CAUSAL_PRETRAIN, "--train_data={mlm_records}"],
     "holds masked-LM examples, not causal-LM blocks; make it with 'bert-train "
     "create_pretraining_data --objective=causal_lm'"),
    ("causal pretrain blocks of another length",
     [*CAUSAL_PRETRAIN, "--gin_param=CausalLMConfig.block_size = 32"],
     "has blocks of 64 tokens but CausalLMConfig.block_size=32; pass "
     "CausalLMConfig.block_size = 64"),
    ("causal pretrain vocab of another size",
     [*CAUSAL_PRETRAIN, "--gin_param=build_causal_lm.vocab_size = 30522"],
     "has 3000 tokens but the model's vocab_size is 30522; set build_causal_lm.vocab_size = "
     "3000"),
    ("causal pretrain from a BERT checkpoint", [*CAUSAL_PRETRAIN, "--init_checkpoint={pretrained}"],
     "--init_checkpoint={pretrained} holds a BertEncoder; the causal_lm objective "
     "warm-starts from a CausalLM"),
    ("masked-LM pretrain on causal blocks",
     ["pretrain", "--gin_file=configs/smoke.gin", "--model_dir={fresh}",
      "--gin_param=build_encoder.vocab_size = 3000", "--train_data={causal_blocks}",
      "--vocab_file={vocab}"],
     "holds causal-LM blocks (create_pretraining_data --objective=causal_lm), not masked-LM "
     "examples"),
    ("masked-LM pretrain from a causal model",
     ["pretrain", "--gin_file=configs/smoke.gin", "--model_dir={fresh}",
      "--train_data={mlm_records}", "--init_checkpoint={causal_model}"],
     "--init_checkpoint={causal_model} holds a CausalLM; the masked_lm objective warm-starts "
     "from a BERT encoder"),
    ("pretrain unknown objective",
     [*CAUSAL_PRETRAIN, "--gin_param=pretraining_objective.name = 'gpt'"],
     "pretraining_objective.name='gpt' is unknown; use one of ('masked_lm', 'causal_lm')"),
]


# ------------------------------------------------------------------------------------------
# Generation (tests/cli/test_bad_inputs.py test_generate_bad_input_refused_before_anything_is_
# written): `bert-train generate`'s settings, prompts, sources and outputs. Placeholders:
# {causal} a tiny causal model_dir (32 positions: 16 for the prompt by default),
# {classifier} a fine-tuned classification model_dir ({relabelled}: a copy whose task says
# causal_lm), {gen_root} a directory holding GENERATE_FILES, {missing} a path that does not
# exist. Nothing may be written: no --output file appears, and the model_dirs and {gen_root}
# keep every byte.
# ------------------------------------------------------------------------------------------
GENERATE_FILES = {
    "train.tsv": "text\tlabel\ngood film\t1\nbad film\t0\n",
    "prompts.txt": "the cat sat on the\njohn lives in paris\n",
    "long_prompts.txt": "the cat\n" + "cat " * 40 + "\n",
    "gen_notes.txt": "my notes\n",
    "old_generations.jsonl": '{"prompt": "the", "generated": "cat", "score": -1.5}\n',
    "latin1_prompts.txt": "caf\xe9\n",
}
GEN = ["generate", "--model_dir={causal}", "--prompt=the cat sat"]
GEN_OUT = "{gen_root}/new.jsonl"
GENERATE_CASES = [
    ("generate prompt longer than the positions",
     [*GEN[:2], "--input={gen_root}/long_prompts.txt", f"--output={GEN_OUT}"],
     "prompt 2 ('cat cat cat cat cat cat cat cat cat cat ') has 41 pieces ([SEP] included); "
     "with max_new_tokens=16 that needs 57 positions, more than the model's 32"),
    ("generate prompt plus max_new_tokens beyond the positions",
     [*GEN[:2], "--prompt=" + "the " * 10, "--max_new_tokens=25", f"--output={GEN_OUT}"],
     "has 11 pieces ([SEP] included); with max_new_tokens=25 that needs 36 positions"),
    ("generate max_new_tokens filling every position",
     [*GEN, "--max_new_tokens=32", f"--output={GEN_OUT}"],
     "--max_new_tokens=32 leaves no position for the prompt: the model has 32 positions"),
    ("generate max_new_tokens 0", [*GEN, "--max_new_tokens=0", f"--output={GEN_OUT}"],
     "--max_new_tokens=0 must be >= 1"),
    ("generate top_p 0", [*GEN, "--top_p=0", f"--output={GEN_OUT}"],
     "--top_p=0.0 must be in (0, 1] (1: every token)"),
    ("generate top_p above 1", [*GEN, "--top_p=1.5", f"--output={GEN_OUT}"],
     "--top_p=1.5 must be in (0, 1]"),
    ("generate top_p nan", [*GEN, "--top_p=nan", f"--output={GEN_OUT}"],
     "flag --top_p=nan: must be a finite number"),
    ("generate negative top_k", [*GEN, "--top_k=-1", f"--output={GEN_OUT}"],
     "--top_k=-1 must be >= 0 (0: every token)"),
    ("generate negative temperature", [*GEN, "--temperature=-0.5", f"--output={GEN_OUT}"],
     "--temperature=-0.5 must be >= 0 (0: greedy)"),
    ("generate negative seed", [*GEN, "--seed=-3", f"--output={GEN_OUT}"],
     "--seed=-3 must be in [0, 2147483647]"),
    ("finetune from a causal model_dir",
     ["finetune", "--task=classification", "--train_file={gen_root}/train.tsv",
      "--init_checkpoint={causal}", "--model_dir={missing}"],
     "--init_checkpoint={causal} holds a causal language model (CausalLM), not a BERT "
     "encoder; fine-tuning starts from a masked-LM encoder"),
    ("generate from a classifier",
     ["generate", "--model_dir={classifier}", "--prompt=a", f"--output={GEN_OUT}"],
     "--model_dir={classifier} is not a causal language model (it was trained for task "
     "'toy_classification')"),
    ("generate from a BERT model_dir labelled causal_lm",
     ["generate", "--model_dir={relabelled}", "--prompt=a", f"--output={GEN_OUT}"],
     "{relabelled}/bert_train.json: the encoder is a BertEncoder, not a causal language model "
     "(CausalLM)"),
    ("generate from a missing model_dir",
     ["generate", "--model_dir={missing}", "--prompt=a", f"--output={GEN_OUT}"],
     "{missing}/bert_train.json does not exist"),
    ("generate from a missing export",
     ["generate", "--saved_model={missing}", "--prompt=a", f"--output={GEN_OUT}"],
     "--saved_model={missing} holds no saved_model.pb"),
    ("generate from a model_dir and an export",
     [*GEN, "--saved_model={causal}", f"--output={GEN_OUT}"],
     "pass exactly one of --model_dir (a causal LM run) and --saved_model"),
    ("generate prompt and input", [*GEN, "--input={gen_root}/prompts.txt",
                                   f"--output={GEN_OUT}"],
     "pass --prompt or --input, not both"),
    ("generate missing input", [*GEN[:2], "--input={missing}", f"--output={GEN_OUT}"],
     "--input={missing} does not exist"),
    ("generate input not UTF-8",
     [*GEN[:2], "--input={gen_root}/latin1_prompts.txt", f"--output={GEN_OUT}"],
     "{gen_root}/latin1_prompts.txt:1: not UTF-8 text"),
    ("generate existing output", [*GEN, "--output={gen_root}/old_generations.jsonl"],
     "--output={gen_root}/old_generations.jsonl exists; choose another path or pass "
     "--overwrite"),
    ("generate --overwrite of a file that is not generations",
     [*GEN, "--output={gen_root}/gen_notes.txt", "--overwrite"],
     "--output={gen_root}/gen_notes.txt is not a generations file"),
    ("generate output inside the model_dir", [*GEN, "--output={causal}/out.jsonl"],
     "--output={causal}/out.jsonl is inside the model directory {causal}"),
    ("generate --overwrite, a prompt too long: the old output stays",
     [*GEN[:2], "--input={gen_root}/long_prompts.txt",
      "--output={gen_root}/old_generations.jsonl", "--overwrite"], "has 41 pieces"),
]



# ------------------------------------------------------------------------------------------
# Files and configs from elsewhere, run by the tables above: configs are data, and a
# plugin family module named as a path is one line.
# ------------------------------------------------------------------------------------------
BAD_FILES.update({
    "imports.gin": "include 'configs/smoke.gin'\nimport os\n",
    "dynamic.gin": "from __gin__ import dynamic_registration\nimport os\n"
                   "TrainerConfig.train_steps = @os.system()\nos.system.command = 'true'\n",
})
CLI_CASES.extend([
    ("gin file imports a module", [*PRETRAIN, "--gin_file={imports.gin}"],
     "{imports.gin}:2: 'import os' is refused: a config may not import code"),
    ("gin file enables dynamic registration", [*PRETRAIN, "--gin_file={dynamic.gin}"],
     "{dynamic.gin}:1: 'from __gin__ import dynamic_registration' is refused"),
    ("gin_param references an unregistered callable",
     [*PRETRAIN, "--gin_param=TrainerConfig.train_steps = @os.system()"],
     "'@os.system' is not a registered configurable"),
])
FAMILY_CASES.append(
    ("finetune family module given as a path", [*SST2_FRESH, "--family_module=./my_family.py"],
     "--family_module: './my_family.py' is a file path, not a module name; put its folder on "
     "PYTHONPATH and pass --family_module=my_family"))


# Weights that are not what they claim, and a model_dir that names a module to import (issue
# 33): written by `write_untrusted_dirs` into the `inputs` fixture's root.
def write_untrusted_dirs(root, pretrained: str) -> dict[str, str]:
    """{int_weights_model, nan_weights_model}: Hugging Face BERT directories whose
    safetensors hold int32 / NaN tensors; {planted_run}: a copy of `pretrained` whose
    bert_train.json records a task of a plugin family from module `planted_family`."""
    import pathlib  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    from bert_trainer.interop import formats, hf  # noqa: PLC0415

    root = pathlib.Path(root)
    config = formats.BertConfig(vocab_size=40, hidden_size=16, num_layers=1,
                                num_attention_heads=2, inner_dim=32, max_sequence_length=32)
    vocab = root / "untrusted_vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab.write_text("".join(f"{t}\n" for t in specials + [f"t{i}" for i in range(35)]),
                     encoding="utf-8")
    weights = {n: np.full(s, 0.5, np.float32) for g in (formats.ENCODER, formats.POOLER)
               for n, s in formats.reference_shapes(config, g).items()}
    paths = {}
    for name in ("int_weights_model", "nan_weights_model"):
        hf.write_hf(str(root / name), formats.BertCheckpoint(config, weights, str(vocab), True,
                                                             "m", "m"))
        file = root / name / formats.HF_WEIGHTS
        tensors = load_file(str(file))
        if name.startswith("int"):
            tensors = {k: v.astype(np.int32) for k, v in tensors.items()}
        else:
            tensors["encoder.layer.0.output.dense.weight"][0, 0] = np.nan
        save_file(tensors, str(file), metadata={"format": "pt"})
        paths[name] = str(root / name)
    planted = root / "planted_run"
    shutil.copytree(pretrained, planted)
    info_file = planted / "bert_train.json"
    info = json.loads(info_file.read_text())
    info["task"] = {"name": "planted_task", "family": "planted", "seq_length": 32,
                    "family_module": "planted_family"}
    info_file.write_text(json.dumps(info))
    paths["planted_run"] = str(planted)
    paths["edited_family_run"] = _edited_family_run(root, pretrained, "squad")
    paths["edited_to_tagging_run"] = _edited_family_run(root, pretrained, "tagging")
    paths.update(truncated_shards(root, str(pathlib.Path(pretrained) / "vocab.txt")))
    return paths


def truncated_shards(root, vocab: str) -> dict[str, str]:
    """{truncated_blocks, truncated_mlm}: globs of 2 causal-LM / masked-LM shards (block and
    sequence length 32), the second cut 7 bytes short."""
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.causal_lm import corpus as causal_lm_data  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    text = root / "shard_corpus.txt"
    text.write_text("".join(f"the film {i} was good . it was fine .\nthe end {i} .\n\n"
                            for i in range(120)), encoding="utf-8")
    causal_lm_data.create_causal_lm_data(
        str(text), vocab, str(root / "cut_blocks" / "b-*.tfrecord"),
        causal_lm_data.CausalDataConfig(block_size=32), options=CorpusOptions(num_shards=2),
        progress=None)
    cpd.create_pretraining_data(str(text), vocab, str(root / "cut_mlm" / "m-*.tfrecord"),
                                cpd.PretrainingDataConfig(max_seq_length=32),
                                options=CorpusOptions(num_shards=2),
                                progress=None)
    for kind in ("cut_blocks", "cut_mlm"):
        last = sorted((root / kind).glob("*-of-*.tfrecord"))[-1]
        with open(last, "r+b") as f:
            f.truncate(last.stat().st_size - 7)
    return {"truncated_blocks": str(root / "cut_blocks" / "b-*.tfrecord"),
            "truncated_mlm": str(root / "cut_mlm" / "m-*.tfrecord")}


SUBPROCESS_CASES.extend([
    ("convert int32 weights", ["convert", "--input={int_weights_model}", "--output={root}/conv9"],
     "{int_weights_model}/model.safetensors: embeddings.word_embeddings.weight holds int32 "
     "values where float weights belong"),
    ("convert NaN weights",
     ["convert", "--input={nan_weights_model}", "--output={root}/conv10", "--verify"],
     "{nan_weights_model}/model.safetensors: encoder.layer.0.output.dense.weight holds 1 "
     "NaN/Inf values"),
])
CLI_CASES.extend([
    ("finetune init_checkpoint of int32 weights",
     [*SST2, "--model_dir={fresh}", "--train_file={good.tsv}",
      "--init_checkpoint={int_weights_model}"],
     "embeddings.word_embeddings.weight holds int32 values where float weights belong"),
])
_CUT = "-00001-of-00002.tfrecord: truncated record at byte "
CLI_CASES.extend([
    ("pretrain masked-LM on a truncated shard",
     ["pretrain", "--gin_file=configs/smoke.gin", "--model_dir={root}/cut_mlm_run",
      "--train_data={truncated_mlm}", "--vocab_file={vocab}",
      "--gin_param=build_encoder.vocab_size = 3000",
      "--gin_param=PretrainingConfig.seq_length = 32",
      "--gin_param=TrainerConfig.train_steps = 40"], "{root}/cut_mlm/m" + _CUT),
    ("pretrain causal-LM on a truncated shard",
     ["pretrain", "--gin_file=configs/causal_lm/tiny.gin", "--model_dir={root}/cut_blocks_run",
      "--train_data={truncated_blocks}", "--vocab_file={vocab}",
      "--gin_param=build_causal_lm.vocab_size = 3000",
      "--gin_param=build_causal_lm.hidden_size = 32", "--gin_param=CausalLMConfig.block_size = 32",
      "--gin_param=TrainerConfig.train_steps = 40"], "{root}/cut_blocks/b" + _CUT),
])
FAMILY_CASES.append(
    ("evaluate a model_dir naming a family module", ["evaluate", "--model_dir={planted_run}"],
     "{planted_run}/bert_train.json: the task family 'planted' is in the module "
     "'planted_family', which is imported only when you name it"))


# A plugin family module that raises on import (tests/family_plugin/raises_on_import.py), and
# a second run on a model_dir whose lock file was deleted while a live process holds it
# ({unlinked_run}, test_bad_inputs.py's `run_paths`). Before 69e53bc only an
# ImportError was caught (a RuntimeError was a 28-line traceback); before 85ecbdb the lock was
# the file alone, so the second run created a new one and trained. SIGTERM needs a signal
# mid-write: tests/cli/test_sigterm.py; a lock that goes mid-run: tests/training/test_run_lock.py.
FAMILY_CASES.append(
    ("finetune family module raises on import",
     [*SST2_FRESH, "--family_module=family_plugin.raises_on_import"],
     "--family_module: importing the task family module 'family_plugin.raises_on_import' "
     "failed: RuntimeError: the plugin's table is missing; fix the module"))
MODEL_DIR_CASES.extend([
    ("finetune in a model_dir whose lock file was deleted",
     [*SST2_AGAIN, "--model_dir={unlinked_run}"],
     "--model_dir={unlinked_run} is in use by another run; wait for it or choose another "
     "--model_dir"),
    ("pretrain in a model_dir whose lock file was deleted",
     [*PRETRAIN, "--model_dir={unlinked_run}"],
     "--model_dir={unlinked_run} is in use by another run"),
])


# ------------------------------------------------------------------------------------------
# Numbers and names users would not mean (issue 46): refused in one line before anything is
# written. Before: "1", "1.0" and "01" became three classes without a word.
# ------------------------------------------------------------------------------------------
PRECHECK_FILES["spelled_labels.tsv"] = SST2_HEADER + "".join(
    f"a {w} film\t{['1', '2', '1.0', '01'][i % 4]}\n" for i, w in enumerate(
        ["fine", "bad", "great", "dull"] * 3))
PRECHECK_CASES.extend([
    ("finetune one number spelled as two labels",
     [*FRESH, "--task=classification", "--text_column=sentence",
      "--train_file={spelled_labels.tsv}", "--eval_file={spelled_labels.tsv}"],
     "{spelled_labels.tsv}:4: label '1.0' is the number '1' (line 2) written another way, "
     "which would make them two classes; write each class one way"),
])


# Inputs that are outputs (issue 46): an --input glob matching the run's own output, or a
# TFRecord file, is refused before anything is read or written. Before, with --overwrite and
# --encoding_errors=replace, the shards were read as text (853 examples of binary junk instead
# of 371) and replaced; vocab learned from its own old vocabulary and replaced it.
_OWN_DATA = ["create_pretraining_data", "--vocab={vocab}", "--overwrite",
             "--encoding_errors=replace", "--output={outputs_root}/data/train-*.tfrecord"]
_NARROW = "; narrow --input to the text files, e.g. --input='DIR/*.txt'"
OUTPUT_CASES.extend([
    ("create_pretraining_data --input glob matching its own shards",
     [*_OWN_DATA, "--input={outputs_root}/data/*"],
     "--input={outputs_root}/data/* matches {outputs_root}/data/train-00000-of-00002.tfrecord, "
     "a shard of this run's --output={outputs_root}/data/train-*.tfrecord" + _NARROW),
    ("create_pretraining_data --input naming its own summary",
     [*_OWN_DATA, "--input={outputs_root}/corpus.txt,{outputs_root}/data/train-summary.json"],
     "matches {outputs_root}/data/train-summary.json, the summary this run writes "
     "(--output={outputs_root}/data/train-*.tfrecord)" + _NARROW),
    ("create_pretraining_data --input holding another set's TFRecord shard",
     ["create_pretraining_data", "--vocab={vocab}", "--encoding_errors=replace",
      "--input={outputs_root}/corpus.txt,{outputs_root}/odd_summary/train-00000-of-00002"
      ".tfrecord", "--output={outputs_root}/new_data/train-*.tfrecord"],
     "matches {outputs_root}/odd_summary/train-00000-of-00002.tfrecord, a TFRecord file "
     "(binary records, not text)" + _NARROW),
    ("create_pretraining_data --input holding another set's summary",
     ["create_pretraining_data", "--vocab={vocab}", "--encoding_errors=replace",
      "--input={outputs_root}/corpus.txt,{outputs_root}/mixed_data/train-summary.json",
      "--output={outputs_root}/new_data/train-*.tfrecord"],
     "matches {outputs_root}/mixed_data/train-summary.json, the summary of a pretraining data "
     "set (create_pretraining_data wrote it)" + _NARROW),
    ("vocab --input glob matching its own output",
     ["vocab", "--input={outputs_root}/*", "--output={outputs_root}/my_vocab.txt",
      "--overwrite", "--encoding_errors=replace"],
     "--input={outputs_root}/* matches {outputs_root}/my_vocab.txt, the vocabulary this run "
     "writes (--output={outputs_root}/my_vocab.txt)" + _NARROW),
])


# Refusals that name the right cause (issue 46). Before: a vocab.txt starting with a BOM was
# "lacks the special tokens [PAD]" (line 1 is [PAD]); an sst2 run whose bert_train.json family
# was edited to squad got "seq_length=32 leaves no room for the context ...; raise --seq_length".
BAD_FILES["bom_vocab.txt"] = "\ufeff" + "".join(
    f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film"])
_BOM = ("vocab file {bom_vocab.txt} starts with a UTF-8 byte-order mark (BOM), which the "
        "tokenizer would read as part of its first token '[PAD]'; re-save it as UTF-8 without a "
        "BOM")
CLI_CASES.extend([
    ("create_pretraining_data vocab with a BOM",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={bom_vocab.txt}",
      "--output={root}/d6-*.tfrecord"], _BOM),
    ("finetune vocab with a BOM",
     [*SST2, "--model_dir={fresh}", "--train_file={good.tsv}", "--vocab_file={bom_vocab.txt}"],
     _BOM),
])
FAMILY_CASES.append(
    ("evaluate a model_dir whose task family was edited",
     ["evaluate", "--model_dir={edited_family_run}", "--eval_file={good.tsv}"],
     "{edited_family_run}/bert_train.json: the task entry names family 'squad' (task 'squad') "
     "but records the class names ['negative', 'positive'], which a squad task does not have: "
     "the entry does not describe the model trained here"))
FAMILY_CASES.append(
    ("evaluate a model_dir whose task family was edited to tagging",
     ["evaluate", "--model_dir={edited_to_tagging_run}", "--eval_file={good.tsv}"],
     "{edited_to_tagging_run}/bert_train.json: the task entry names family 'tagging' (task "
     "'sst2') but records the columns text='sentence', label='label', which a tagging task "
     "does not have"))


def _edited_family_run(root, pretrained: str, family: str) -> str:
    """A copy of `pretrained` whose bert_train.json records an sst2 classifier's task entry
    (as finetune writes it) with its family edited to `family` (and its name, for squad)."""
    import pathlib  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    edited = pathlib.Path(root) / f"edited_to_{family}_run"
    shutil.copytree(pretrained, edited)
    info_file = edited / "bert_train.json"
    info = json.loads(info_file.read_text())
    info["task"] = {"name": "squad" if family == "squad" else "sst2", "family": family,
                    "label_names": ["negative", "positive"], "seq_length": 32,
                    "text_keys": ["text"], "metrics": ["accuracy"], "pooling": "cls",
                    "columns": {"text": "sentence", "text_b": None, "label": "label"},
                    "has_header": True, "best_metric": "accuracy"}
    info_file.write_text(json.dumps(info))
    return str(edited)


# Numbers users would not mean (issue 46). Before: --train_steps=10^12 trained (a 10^11-step
# warmup, the learning rate ~0, "ETA 29644369h"); --batch_size=10^7 on 2,556 rows trained
# 640 micro-batches a step. Both now refused before a model_dir is made ({fresh}).
CLI_CASES.extend([
    ("finetune absurd train_steps", [*SST2_FRESH, "--train_steps=1000000000000"],
     "TrainerConfig: train_steps=1000000000000 is over 10^9, 1,000 times BERT's 10^6 steps"),
    ("pretrain absurd train_steps",
     [*PRETRAIN, "--gin_param=TrainerConfig.train_steps = 1000000000000"],
     "TrainerConfig: train_steps=1000000000000 is over 10^9"),
    ("finetune batch far beyond the rows, steps given", [*SST2_FRESH, "--batch_size=10000000"],
     "FinetuneConfig.train_batch_size=10000000 (--batch_size) is over 100x the 24 training rows "
     "of {good.tsv}: every batch would hold each row about 416666 times; use --batch_size <= 24"),
    ("finetune batch far beyond the rows, steps from epochs",
     [*FT, "--model_dir={fresh}", "--task=sst2", "--train_file={good.tsv}",
      "--eval_file={good.tsv}", "--batch_size=5000"],
     "FinetuneConfig.train_batch_size=5000 (--batch_size) is over 100x the 24 training rows"),
])

# The environment a run reads (issue 46), as (name, environment, argv, message): checked
# before anything is written. Before: BERT_TRAIN_PEAK_FLOPS=abc was refused only after the
# model_dir was filled (bert_train.json, operative_config.gin, vocab.txt, train/ events); a
# malformed TF_CONFIG was a 48-line json.decoder.JSONDecodeError traceback, exit 1.
_PEAK = ("BERT_TRAIN_PEAK_FLOPS='abc' must be a number > 0: one device's peak FLOP/s in the "
         "run's precision")
ENV_CASES = [
    ("finetune bad BERT_TRAIN_PEAK_FLOPS", {"BERT_TRAIN_PEAK_FLOPS": "abc"}, SST2_FRESH, _PEAK),
    ("pretrain bad BERT_TRAIN_PEAK_FLOPS", {"BERT_TRAIN_PEAK_FLOPS": "abc"},
     [*PRETRAIN, "--model_dir={fresh}"], _PEAK),
    ("finetune TF_CONFIG not JSON", {"TF_CONFIG": '{"cluster": {"worker": ["localhost:1"'},
     [*SST2_FRESH, "--strategy=multi_worker_mirrored"],
     "TF_CONFIG is not valid JSON (Expecting ',' delimiter at character 37); set it as in "),
    ("finetune TF_CONFIG cluster not an object", {"TF_CONFIG": '{"cluster": ["localhost:1"]}'},
     [*SST2_FRESH, "--strategy=multi_worker_mirrored"],
     "TF_CONFIG must be a JSON object whose \"cluster\" and \"task\" are objects"),
]
