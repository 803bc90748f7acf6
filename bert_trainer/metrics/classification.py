"""Sentence-level evaluation metrics: accuracy, F1, Matthews correlation, Pearson, Spearman.

Host-side numpy only, run once per evaluation on the gathered labels and predictions (the
GLUE definitions, which are also scikit-learn's and scipy's). Predictions are class ids for
the classification metrics (callers take the argmax of the logits) and real numbers for the
correlations (STS-B regression).

Degenerate inputs: when a correlation is undefined because one side is constant (its
variance is 0), `matthews_corrcoef`, `pearson` and `spearman` return 0.0, not nan. A model
that always predicts the same thing carries no correlation with the labels, 0.0 says so, and
it keeps "best checkpoint by metric" comparisons and averages over evaluations finite (a nan
compares false with everything). scikit-learn's MCC makes the same choice.
"""

import numpy as np

from bert_trainer.errors import UserError


def _check_pair(labels, predictions, dtype=None):
    """Validates two 1-D arrays of the same non-zero length.

    Args:
      labels: array-like, shape [num_examples].
      predictions: array-like, shape [num_examples].
      dtype: optional numpy dtype both are converted to.

    Returns:
      (labels, predictions) as numpy arrays of shape [num_examples].

    Raises:
      ValueError: naming the arrays and their shapes when they are not 1-D, differ in
        length or are empty, or when a float array holds NaN/Inf.
    """
    labels = np.asarray(labels, dtype=dtype)
    predictions = np.asarray(predictions, dtype=dtype)
    if labels.ndim != 1 or predictions.ndim != 1:
        raise ValueError(
            f"labels and predictions must be 1-D, got labels {labels.shape} and predictions "
            f"{predictions.shape} (take the argmax of logits before calling)")
    if labels.shape != predictions.shape:
        raise ValueError(
            f"labels has {labels.shape[0]} values but predictions has {predictions.shape[0]}; "
            "they must hold one value per example")
    if labels.size == 0:
        raise ValueError("labels and predictions are empty: a metric needs at least one example")
    for name, array in (("labels", labels), ("predictions", predictions)):
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise ValueError(f"{name} holds NaN or Inf values")
    return labels, predictions


def accuracy(labels, predictions):
    """Fraction of examples whose predicted class equals the label.

    Args:
      labels: int array, shape [num_examples].
      predictions: int array (class ids), shape [num_examples].

    Returns:
      A float in [0, 1].
    """
    labels, predictions = _check_pair(labels, predictions)
    return float(np.mean(labels == predictions))


def _f1_of_class(labels, predictions, cls):
    """F1 of one class taken as positive; 0.0 when it has no true or predicted example."""
    true_positives = np.sum((predictions == cls) & (labels == cls))
    predicted = np.sum(predictions == cls)
    actual = np.sum(labels == cls)
    # 2TP / (2TP + FP + FN) == 2PR / (P + R), and is defined (as 0) when P or R is 0/0.
    denominator = predicted + actual
    return float(2 * true_positives / denominator) if denominator else 0.0


def f1(labels, predictions, average="binary", pos_label=1):
    """F1 score of class predictions.

    Args:
      labels: int array, shape [num_examples].
      predictions: int array (class ids), shape [num_examples].
      average: "binary" for the F1 of `pos_label` (MRPC, QQP), or "macro" for the unweighted
        mean of the per-class F1 over every class seen in labels or predictions.
      pos_label: the positive class for "binary".

    Returns:
      A float in [0, 1]. A class with no true and no predicted example scores 0.

    Raises:
      ValueError: bad shapes, an unknown `average`, or more than two classes with "binary".
    """
    labels, predictions = _check_pair(labels, predictions)
    classes = np.union1d(labels, predictions)
    if average == "binary":
        if classes.size > 2:
            raise ValueError(
                f"f1(average='binary') got {classes.size} classes {classes.tolist()}; "
                "use average='macro' for multi-class labels")
        return _f1_of_class(labels, predictions, pos_label)
    if average == "macro":
        return float(np.mean([_f1_of_class(labels, predictions, c) for c in classes]))
    raise ValueError(f"f1 average must be 'binary' or 'macro', got {average!r}")


def matthews_corrcoef(labels, predictions):
    """Matthews correlation coefficient (CoLA), multi-class form (Gorodkin 2004).

    With C the confusion matrix, n examples, c correct, t_k true and p_k predicted counts:
    MCC = (c*n - t.p) / sqrt((n^2 - p.p) * (n^2 - t.t)). For two classes this is
    (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)).

    Args:
      labels: int array, shape [num_examples].
      predictions: int array (class ids), shape [num_examples].

    Returns:
      A float in [-1, 1]; 0.0 when labels or predictions are constant (see module docstring).
    """
    labels, predictions = _check_pair(labels, predictions)
    classes, inverse = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    num_examples = labels.size
    true_counts = np.bincount(inverse[:num_examples], minlength=classes.size).astype(np.float64)
    pred_counts = np.bincount(inverse[num_examples:], minlength=classes.size).astype(np.float64)
    correct = float(np.sum(labels == predictions))
    n = float(num_examples)
    covariance = correct * n - true_counts @ pred_counts
    denominator = (n * n - pred_counts @ pred_counts) * (n * n - true_counts @ true_counts)
    if denominator == 0.0:
        return 0.0
    return float(covariance / np.sqrt(denominator))


def _pearson(x, y):
    """Pearson r of two validated float64 vectors; 0.0 if either is constant."""
    x = x - x.mean()
    y = y - y.mean()
    denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
    if denominator == 0.0:
        return 0.0
    # Rounding can push a perfect correlation a hair past 1.
    return float(np.clip(np.sum(x * y) / denominator, -1.0, 1.0))


def pearson(labels, predictions):
    """Pearson correlation coefficient (STS-B).

    Args:
      labels: float array, shape [num_examples].
      predictions: float array, shape [num_examples].

    Returns:
      A float in [-1, 1]; 0.0 when either side is constant (see module docstring).
    """
    labels, predictions = _check_pair(labels, predictions, dtype=np.float64)
    return _pearson(labels, predictions)


def average_ranks(values):
    """1-based ranks of `values`; tied values all get the mean of the ranks they span.

    Args:
      values: array, shape [num_values].

    Returns:
      float64 array, shape [num_values]. E.g. [10, 20, 20, 5] -> [2, 3.5, 3.5, 1].
    """
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)            # the highest rank each distinct value spans
    first_rank = last_rank - counts + 1
    return ((first_rank + last_rank) / 2.0)[inverse.reshape(-1)]


def spearman(labels, predictions):
    """Spearman rank correlation (STS-B): Pearson r of the average ranks.

    Args:
      labels: float array, shape [num_examples].
      predictions: float array, shape [num_examples].

    Returns:
      A float in [-1, 1]; 0.0 when either side is constant (see module docstring).
    """
    labels, predictions = _check_pair(labels, predictions, dtype=np.float64)
    return _pearson(average_ranks(labels), average_ranks(predictions))


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": lambda labels, predictions: f1(labels, predictions, average="macro"),
    "matthews_corrcoef": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(metric_names, labels, predictions):
    """Computes several metrics on the same labels and predictions.

    Args:
      metric_names: iterable of names from `METRICS` (e.g. a task's configured metrics).
      labels: array, shape [num_examples].
      predictions: array, shape [num_examples] (class ids, or scores for correlations).

    Returns:
      dict name -> float, in the order given.

    Raises:
      UserError: a name that is not in `METRICS` (it usually comes from a config).
    """
    metric_names = list(metric_names)
    unknown = [name for name in metric_names if name not in METRICS]
    if unknown:
        raise UserError(
            f"unknown metric {unknown[0]!r}: choose from {', '.join(sorted(METRICS))}")
    return {name: METRICS[name](labels, predictions) for name in metric_names}
