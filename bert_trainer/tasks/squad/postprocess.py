"""SQuAD logits back to answer text: the best valid span over each question's windows.

The windows (`SquadFeature`) and examples (`SquadExample`) come from
`bert_trainer.tasks.squad.data.squad_eval_data`; each context piece keeps its character span in
the original context, so the answer is an exact slice of it.
"""

import collections

import numpy as np


def _best_span(window, start: np.ndarray, end: np.ndarray, n_best: int,
               max_answer_length: int):
    """(score, start piece, end piece) of the best valid span of one window, or None."""
    starts = np.argsort(start)[::-1][:n_best, None]  # (n_best, 1)
    ends = np.argsort(end)[::-1][None, :n_best]  # (1, n_best)
    in_context = window.char_spans[:, 0] >= 0
    valid = (in_context[starts] & window.is_max_context[starts] & in_context[ends]
             & (ends >= starts) & (ends - starts < max_answer_length))
    if not valid.any():
        return None
    scores = np.where(valid, start[starts] + end[ends], -np.inf)
    i, j = np.unravel_index(np.argmax(scores), scores.shape)
    return scores[i, j], int(starts[i, 0]), int(ends[0, j])


def postprocess_squad(examples, features, start_logits, end_logits, *, n_best: int = 20,
                      max_answer_length: int = 30, version_2: bool = False,
                      null_threshold: float = 0.0, unique_ids=None) -> dict[str, str]:
    """Answer text of every question from the windows' start/end logits.

    For each question: over its windows, the highest `start_logit + end_logit` span among the
    top `n_best` starts and ends whose pieces are both in the context, in order, at most
    `max_answer_length` pieces long, starting where the window has max context. The text is
    the original context between the span's character offsets. v2.0 answers "" when the best
    [CLS] score beats the best span by more than `null_threshold` (google-research/bert).

    Args:
      examples: the `SquadExample` list the windows were made from.
      features: the `SquadFeature` list (`SquadEvalData.features`).
      start_logits, end_logits: float [num_windows, seq_length]; row i belongs to
        `features[i]`, or to the window `unique_ids[i]` when given (gathered out of order).
      n_best, max_answer_length, version_2, null_threshold: as above.
      unique_ids: optional int [num_windows] `UNIQUE_IDS` of the logits rows.

    Returns:
      {question id: answer text}.
    """
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    if unique_ids is None:
        unique_ids = np.arange(len(start_logits))
    row_of = {int(u): r for r, u in enumerate(np.asarray(unique_ids))}
    missing = [w.unique_id for w in features if w.unique_id not in row_of]
    if missing or start_logits.shape != end_logits.shape:
        raise ValueError(f"logits {start_logits.shape}/{end_logits.shape} do not cover the "
                         f"{len(features)} windows (missing unique ids {missing[:5]})")
    by_example = collections.defaultdict(list)
    for window in features:
        by_example[window.example_index].append(window)
    answers = {}
    for index, example in enumerate(examples):
        best, null_score = None, np.inf
        for window in by_example[index]:
            row = row_of[window.unique_id]
            start, end = start_logits[row], end_logits[row]
            null_score = min(null_score, start[0] + end[0])
            span = _best_span(window, start, end, n_best, max_answer_length)
            if span is not None and (best is None or span[0] > best[0][0]):
                best = (span, window)
        if best is None or (version_2 and null_score - best[0][0] > null_threshold):
            answers[example.id] = ""
            continue
        (_, first, last), window = best
        answers[example.id] = example.context[window.char_spans[first, 0]:
                                              window.char_spans[last, 1]]
    return answers
