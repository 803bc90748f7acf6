"""`predict --saved_model` and `generate --saved_model` refuse a graph that could do more than
answer: its saved_model.pb is checked against the ops of bert-train's own exports
(`export/graph_check.py`, `export/allowed_ops.txt`) before `tf.saved_model.load` runs any of it.

Hostile SavedModels are built here as an attacker would (tf.Module, signatures calling
tf.io.write_file / tf.io.read_file / tf.py_function, a resource whose initializer writes a
file when the model is loaded); each is refused in one line naming the op and its function,
exit 2, and the file it would write never appears. `--trust_saved_model` loads a graph outside
the list. The real export of every family (tests/family_exports.py) passes the check and still
answers, and the list holds exactly the ops those exports use.
"""

import json
import os

import pytest
import tensorflow as tf
from family_exports import FAMILIES, export_every_family

from bert_trainer.errors import EXIT_USER_ERROR, UserError
from bert_trainer.export import generate, graph_check, predict

TEXT = "the cat sat on the mat ."


class _Classifier(tf.Module):
    """A serving_default that looks like a classification export's, doing `action` inside."""

    def __init__(self, action):
        super().__init__()
        self.action = action

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        label = self.action(text)
        n = tf.shape(text)[0]
        return {"label_index": tf.zeros([n], tf.int32), "label_name": label,
                "probabilities": tf.ones([n, 2]) / 2}


class _Generator(tf.Module):
    """The generate and prompt_length signatures of a causal LM export, doing `action`."""

    def __init__(self, action):
        super().__init__()
        self.action = action

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.string, name="prompt"),
        tf.TensorSpec([], tf.int32, name="max_new_tokens"),
        tf.TensorSpec([], tf.float32, name="temperature"),
        tf.TensorSpec([], tf.int32, name="top_k"), tf.TensorSpec([], tf.float32, name="top_p"),
        tf.TensorSpec([], tf.int32, name="seed")])
    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        del max_new_tokens, temperature, top_k, top_p, seed
        return {"generated_text": self.action(prompt), "score": tf.zeros(tf.shape(prompt))}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="prompt")])
    def prompt_length(self, prompt):
        return {"prompt_length": tf.zeros(tf.shape(prompt), tf.int32),
                "max_prompt_length": tf.constant(10), "max_new_tokens": tf.constant(20)}


def _leak(marker):
    """The probe's attack: the inputs written to `marker`, a file's bytes returned."""
    def action(texts):
        tf.io.write_file(marker, tf.strings.reduce_join(texts, separator="\n"))
        return tf.fill(tf.shape(texts), tf.io.read_file(__file__))
    return action


def _python(marker):
    def write(texts):
        with open(marker, "w") as f:  # runs in this process when the graph runs
            f.write("\n".join(t.decode() for t in texts.numpy()))
        return texts
    return lambda texts: tf.py_function(write, [texts], tf.string)


def _upper(texts):  # harmless, but StringUpper is not an op bert-train's exports use
    return tf.strings.upper(texts)


class _WritesOnLoad(tf.saved_model.experimental.TrackableResource):
    """A resource whose initializer `tf.saved_model.load` runs: loading alone writes."""

    def __init__(self, marker):
        self.marker = marker
        super().__init__()

    def _create_resource(self):
        return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="on_load")

    def _initialize(self):
        tf.io.write_file(self.marker, "loading ran the graph")


def _save(module, path, signatures):
    tf.saved_model.save(module, str(path), signatures=signatures)
    os.makedirs(path / "assets.extra", exist_ok=True)  # as the probe: a classifier's record
    (path / "assets.extra" / "bert_train_family.json").write_text(json.dumps(
        {"family": "classification",
         "family_module": "bert_trainer.tasks.classification.family"}))
    return str(path)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    made = {}
    for name, action in (("leak", _leak), ("python", _python), ("upper", lambda m: _upper)):
        marker = str(root / f"PWNED_{name}")
        classify = _Classifier(action(marker))
        made[name] = (_save(classify, root / name, {"serving_default": classify.serve}),
                      marker)
        gen = _Generator(action(marker + "_generate"))
        made[f"{name}_generate"] = (_save(gen, root / f"{name}_gen", {
            "generate": gen.generate, "prompt_length": gen.prompt_length}),
            marker + "_generate")
    on_load = _Classifier(_upper)
    on_load.resource = _WritesOnLoad(str(root / "PWNED_on_load"))
    made["on_load"] = (_save(on_load, root / "on_load", {"serving_default": on_load.serve}),
                       str(root / "PWNED_on_load"))
    inputs = root / "in.txt"
    inputs.write_text("my private text\n", encoding="utf-8")
    made["input"] = str(inputs)
    return made


def _run(capsys, command, *args):
    from bert_trainer import cli  # noqa: PLC0415

    capsys.readouterr()
    rc = cli.main(["bert-train", command, *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _refusal(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"bert-train {command}:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("name, op", [("leak", "WriteFile"), ("python", "EagerPyFunc"),
                                      ("upper", "StringUpper")])
def test_predict_refuses_a_foreign_graph_and_runs_none_of_it(hostile, tmp_path, capsys, name,
                                                             op):
    path, marker = hostile[name]
    output = tmp_path / "pred.jsonl"
    rc, out, err = _run(capsys, "predict", f"--saved_model={path}",
                        f"--input={hostile['input']}", f"--output={output}")
    assert rc == EXIT_USER_ERROR and out == ""
    line = _refusal(err, "predict")
    assert f"--saved_model={path} was not loaded: its graph runs op '{op}'" in line
    assert "in function '__inference_serve_" in line
    assert "reached from signature 'serving_default'" in line and "--trust_saved_model" in line
    assert ("reads or writes files" in line) == (name != "upper")
    assert not os.path.exists(marker) and not output.exists()


@pytest.mark.parametrize("name, op", [("leak", "WriteFile"), ("python", "EagerPyFunc")])
def test_generate_refuses_a_foreign_graph_and_runs_none_of_it(hostile, tmp_path, capsys, name,
                                                              op):
    path, marker = hostile[f"{name}_generate"]
    output = tmp_path / "gen.jsonl"
    rc, out, err = _run(capsys, "generate", f"--saved_model={path}", "--prompt=secret prompt",
                        f"--output={output}")
    assert rc == EXIT_USER_ERROR and out == ""
    line = _refusal(err, "generate")
    assert f"its graph runs op '{op}'" in line
    assert "in function '__inference_generate_" in line
    assert "reached from signature 'generate'" in line
    assert not os.path.exists(marker) and not output.exists()


def test_a_graph_that_writes_when_loaded_is_refused_before_loading(hostile, capsys, tmp_path):
    path, marker = hostile["on_load"]
    rc, _, err = _run(capsys, "predict", f"--saved_model={path}",
                      f"--input={hostile['input']}", f"--output={tmp_path / 'p.jsonl'}")
    line = _refusal(err, "predict")
    assert rc == EXIT_USER_ERROR and "its graph runs op 'WriteFile'" in line
    assert "in function '__inference__initializer_" in line and "which loading runs" in line
    assert not os.path.exists(marker)
    tf.saved_model.load(path)  # what the check prevented: loading alone writes the file
    assert os.path.exists(marker)


def test_trust_saved_model_loads_a_graph_outside_the_list(hostile, tmp_path, capsys):
    path, _ = hostile["upper"]
    output = tmp_path / "pred.jsonl"
    rc, _, err = _run(capsys, "predict", f"--saved_model={path}", "--trust_saved_model",
                      f"--input={hostile['input']}", f"--output={output}")
    assert rc == 0, err
    answer = json.loads(output.read_text(encoding="utf-8"))
    assert answer["label"] == "MY PRIVATE TEXT"  # the graph ran: StringUpper's answer
    path, _ = hostile["upper_generate"]
    output = tmp_path / "gen.jsonl"
    rc, _, err = _run(capsys, "generate", f"--saved_model={path}", "--trust_saved_model",
                      "--prompt=a prompt", f"--output={output}")
    assert rc == 0, err
    assert json.loads(output.read_text(encoding="utf-8"))["generated"] == "A PROMPT"


def test_the_deny_list_holds_even_if_the_allow_list_is_widened(hostile):
    allowed = graph_check.allowed_ops()
    assert not allowed.serving & graph_check.DENIED_OPS
    assert allowed.restore & graph_check.DENIED_OPS <= graph_check.SAVER_FILE_OPS
    careless = graph_check.AllowedOps(allowed.serving | graph_check.DENIED_OPS | {"ReduceJoin"},
                                      allowed.restore)
    with open(os.path.join(hostile["leak"][0], "saved_model.pb"), "rb") as f:
        found = graph_check.foreign_ops(f.read(), ["serving_default"], careless)
    assert {f.op for f in found} == {"WriteFile", "ReadFile"} and all(f.denied for f in found)


class _Saves(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        tf.raw_ops.SaveV2(prefix=self.marker, tensor_names=["leak"], shape_and_slices=[""],
                          tensors=[text])
        return {"label_name": text}


def test_checkpoint_ops_pass_only_in_the_savers_own_functions(tmp_path):
    """SaveV2 is allowed where the saver writes the variables, not in a signature's function,
    even when the graph's SaverDef names the signature's node as its restore op."""
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

    module = _Saves()
    module.marker = str(tmp_path / "PWNED_saver")
    tf.saved_model.save(module, str(tmp_path / "saves"), signatures={"serving_default":
                                                                      module.serve})
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((tmp_path / "saves" / "saved_model.pb").read_bytes())
    meta_graph = proto.meta_graphs[0]
    assert meta_graph.saver_def.restore_op_name  # the export's own saver: allowed as it is
    serving_node = meta_graph.signature_def["serving_default"].outputs["label_name"].name
    for restore_op in (meta_graph.saver_def.restore_op_name, serving_node.split(":")[0]):
        meta_graph.saver_def.restore_op_name = restore_op
        found = graph_check.foreign_ops(proto.SerializeToString(), ["serving_default"])
        assert [(f.op, f.signature, f.denied) for f in found if f.op == "SaveV2"] == [
            ("SaveV2", "serving_default", True)]
    assert not os.path.exists(module.marker)


def test_an_unreadable_saved_model_pb_is_one_line(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff\xff not a SavedModel")
    with pytest.raises(UserError, match=r"saved_model.pb cannot be read as a SavedModel \("):
        predict.load_predictor(saved_model=str(tmp_path))


@pytest.fixture(scope="module")
def every_export(tmp_path_factory):
    return export_every_family(tmp_path_factory.mktemp("family_exports"))


def _ops(path) -> set[str]:
    from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    functions = {f.signature.name for f in graph.library.function}
    return {node.op for node in list(graph.node) + [n for f in graph.library.function
                                                   for n in f.node_def]} - functions


def test_a_classifier_export_passes(tmp_path):
    """make test-fast's share of the test below: the commonest export, alone."""
    path = export_every_family(tmp_path, families=("classification",))["classification"]
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        assert graph_check.foreign_ops(f.read()) == []


@pytest.mark.slow  # exports 13 models
def test_every_familys_export_passes_and_the_list_is_exactly_their_ops(every_export):
    assert set(every_export) == set(FAMILIES)
    for name, path in every_export.items():
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            found = graph_check.foreign_ops(f.read())
        assert found == [], (f"the {name} export uses ops missing from "
                             f"bert_trainer/export/allowed_ops.txt: {sorted({f.op for f in found})}"
                             f" (first in {found[0].where()}); add them if they touch no file, "
                             "process or network")
    allowed = graph_check.allowed_ops()
    used = set().union(*(_ops(path) for path in every_export.values()))
    assert used == allowed.serving | allowed.restore, (
        "allowed_ops.txt lists ops no export uses any more: "
        f"{sorted(allowed.serving | allowed.restore - used)}; remove them")


@pytest.mark.slow
def test_every_familys_export_still_loads_and_answers(every_export):
    for name, path in every_export.items():
        if name == "pretraining":  # no task: refused after the check, for its signatures
            with pytest.raises(UserError, match="has no serving_default signature"):
                predict.load_predictor(saved_model=path)
        elif name == "causal_lm":
            generator = generate.load_generator(saved_model=path)
            out = generator.generate(prompt=tf.constant([TEXT]), max_new_tokens=3,
                                     temperature=0.0, top_k=0, top_p=1.0, seed=0)
            assert out["generated_text"].shape == (1,), name
        else:
            predictor = predict.load_predictor(saved_model=path)
            outputs = predictor({key: [TEXT] for key in predictor.input_names})
            answer = predictor.answers.format_answer(outputs, 0)
            assert answer and all(v is not None for v in answer.values()), (name, answer)
