"""The serving benchmark's PyTorch and ONNX Runtime workers: the same Hugging Face weights,
served the usual fast ways on a CPU.

    $BERT_TRAIN_TORCH_PYTHON scripts/bench/serving_torch.py REQUEST.json

REQUEST.json: {"runtime": "pytorch" | "onnxruntime", "hf_dir", "head": "sequence" | "token",
"num_labels", "seq_length", "inputs": [{"text": ...}], "batch_size", "latency_inputs",
"workdir"}. The model is transformers' `AutoModelFor{Sequence,Token}Classification` of
`hf_dir` (a fresh head: speed does not depend on its weights). A call does what
`bert-train predict` does for the same texts, in the same process:

  - tokenizes (transformers' fast tokenizer), padding the batch to its longest input;
  - sequence: a text longer than `seq_length` is cut into windows half a window apart (the
    tokenizer's overflowing tokens, as bert-train's default windows) and its windows' logits
    are averaged; token: each word gets the argmax of its first piece;
  - pytorch: the model under `torch.inference_mode()`, its default threads (the cores);
  - onnxruntime: the model exported once with `torch.onnx.export` (dynamic batch and length),
    run by an `onnxruntime.InferenceSession` with every graph optimization on.

Batches go in input order (`serving_timing.throughput`), then one input at a time for the
latency (`serving_timing.latency`). Prints one JSON line, or {"skipped": reason} when the
interpreter lacks torch, transformers or onnxruntime.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import serving_timing  # noqa: E402 (numpy and time only)


def _model(torch, transformers, request):
    auto = (transformers.AutoModelForSequenceClassification if request["head"] == "sequence"
            else transformers.AutoModelForTokenClassification)
    model = auto.from_pretrained(request["hf_dir"], num_labels=request["num_labels"])
    return model.eval()


def _onnx_session(torch, model, request):
    """The model exported to ONNX (dynamic batch and length) and its InferenceSession."""
    import onnxruntime  # noqa: PLC0415

    path = os.path.join(request["workdir"], f"{request['head']}-{request['num_labels']}.onnx")
    if not os.path.exists(path):
        example = {name: torch.ones([2, 8], dtype=torch.int64)
                   for name in ("input_ids", "attention_mask", "token_type_ids")}
        axes = {name: {0: "batch", 1: "length"} for name in example}
        axes["logits"] = {0: "batch", 1: "length"} if request["head"] == "token" else {0: "batch"}
        torch.onnx.export(model, (), path + ".tmp", kwargs=example,
                          input_names=list(example), output_names=["logits"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
        os.replace(path + ".tmp", path)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session


def build_call(request):
    """call(items) -> the answers of the texts in `items` (labels, or tags per word)."""
    try:
        import numpy as np  # noqa: PLC0415
        import torch  # noqa: PLC0415
        import transformers  # noqa: PLC0415

        if request["runtime"] == "onnxruntime":
            import onnxruntime  # noqa: F401, PLC0415
    except ImportError as e:
        return None, f"not measured: {e}"
    tokenizer = transformers.AutoTokenizer.from_pretrained(request["hf_dir"])
    model = _model(torch, transformers, request)
    session = _onnx_session(torch, model, request) if request["runtime"] == "onnxruntime" else None
    length = request["seq_length"]
    sequence = request["head"] == "sequence"
    overlap = (length - 2) // 2  # windows half a window apart, as bert-train's default

    def logits_of(encoded, runtime=request["runtime"]) -> np.ndarray:
        names = ("input_ids", "attention_mask", "token_type_ids")
        if runtime == "onnxruntime":
            return session.run(["logits"], {n: encoded[n].astype(np.int64) for n in names})[0]
        with torch.inference_mode():
            return model(**{n: torch.from_numpy(encoded[n].astype(np.int64))
                            for n in names}).logits.numpy()

    def call(items):
        texts = [item["text"] for item in items]
        if sequence:
            encoded = tokenizer(texts, padding="longest", truncation=True, max_length=length,
                                stride=overlap, return_overflowing_tokens=True,
                                return_tensors="np")
            logits = logits_of(encoded)
            owner = np.asarray(encoded["overflow_to_sample_mapping"])
            sums = np.zeros([len(texts), logits.shape[-1]], np.float32)
            np.add.at(sums, owner, logits)
            means = sums / np.bincount(owner, minlength=len(texts))[:, None]
            return means.argmax(-1).tolist()
        words = [text.split() for text in texts]
        encoded = tokenizer(words, is_split_into_words=True, padding="longest",
                            truncation=True, max_length=length, return_tensors="np")
        best = logits_of(encoded).argmax(-1)
        tags = []
        for row in range(len(texts)):
            seen, own = set(), []
            for position, word in enumerate(encoded.word_ids(row)):
                if word is not None and word not in seen:
                    seen.add(word)
                    own.append(int(best[row, position]))
            tags.append(own)
        return tags

    def agreement(items) -> float:
        """The largest difference between this runtime's logits and PyTorch's on `items`."""
        encoded = tokenizer([item["text"] for item in items], padding="longest",
                            truncation=True, max_length=length, return_tensors="np")
        return float(np.max(np.abs(logits_of(encoded) - logits_of(encoded, "pytorch"))))

    call.agreement = agreement
    return call, None


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    call, skipped = build_call(request)
    if call is None:
        print(json.dumps({"skipped": skipped}))
        return
    inputs = request["inputs"]
    print(json.dumps({
        "throughput": serving_timing.throughput(call, inputs, request["batch_size"]),
        "latency": serving_timing.latency(call, inputs[:request["latency_inputs"]]),
        # The runtime computes the model PyTorch does (0 for PyTorch itself).
        "max_abs_logit_difference_from_pytorch": call.agreement(inputs[:request["batch_size"]])}))


if __name__ == "__main__":
    main(sys.argv[1])
