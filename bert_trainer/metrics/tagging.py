"""Entity-level metrics for token tagging (NER), with the conlleval / seqeval definition.

An entity counts as correct only when its type, first word and last word all match a gold
entity. Entities are read from the tags as conlleval does (seqeval's default mode does the
same), which tolerates sequences a strict reader would reject:
- a B- tag always starts an entity; an I- (or E-) tag starts one after O, after the end of an
  entity (E-/S-), or when its type differs from the previous tag's (B-PER I-LOC is two
  entities, PER then LOC);
- an entity ends before O, B-, S-, a type change, or after E-/S-.
That reading is the same for IOB1 (CoNLL-2003's files, where B- only separates two adjacent
entities of one type) and IOB2 (every entity starts with B-); `scheme` checks which prefixes
are allowed, so a file in an unexpected scheme fails loudly instead of scoring wrongly.

Spans are (type, start, end) with `end` exclusive, in word positions.
"""

import collections

OUTSIDE = "O"
_SCHEME_PREFIXES = {"IOB1": "IB", "IOB2": "IB", "BIOES": "BIES", "IOBES": "BIES"}


def _split_tag(tag, scheme):
    """("B", "PER") from "B-PER", ("O", "") from "O"; ValueError on a malformed tag."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, sep, entity_type = str(tag).partition("-")
    if not sep or not entity_type or len(prefix) != 1 or prefix not in _SCHEME_PREFIXES[scheme]:
        allowed = ", ".join(p + "-TYPE" for p in _SCHEME_PREFIXES[scheme])
        raise ValueError(f"tag {tag!r} is not valid in scheme {scheme}: use O, {allowed}")
    return prefix, entity_type


def _check_scheme(scheme):
    if scheme not in _SCHEME_PREFIXES:
        raise ValueError(f"unknown tagging scheme {scheme!r}: use {', '.join(_SCHEME_PREFIXES)}")


def _ends_entity(prev_prefix, prefix, prev_type, entity_type):
    """Whether the entity holding the previous word ends before this word (conlleval)."""
    if prev_prefix in "ES":
        return True
    if prev_prefix in "BI" and prefix in "BSO":
        return True
    return prev_type != entity_type


def _starts_entity(prev_prefix, prefix, prev_type, entity_type):
    """Whether this word starts a new entity (conlleval)."""
    if prefix == OUTSIDE:
        return False
    if prefix in "BS":
        return True
    if prev_prefix in "ESO":  # an I-/E- with no open entity before it
        return True
    return prev_type != entity_type


def get_entities(tags, scheme="IOB2"):
    """Entity spans of one tag sequence.

    Args:
      tags: sequence of tag strings, shape [num_words], e.g. ["B-PER", "I-PER", "O"].
      scheme: "IOB1", "IOB2" or "BIOES" ("IOBES"): the prefixes allowed.

    Returns:
      list of (type, start, end) with `end` exclusive, in order, e.g. [("PER", 0, 2)].

    Raises:
      ValueError: an unknown scheme or a tag it does not allow.
    """
    _check_scheme(scheme)
    entities = []
    prev_prefix, prev_type, start = OUTSIDE, "", None
    for position, tag in enumerate(tags):
        prefix, entity_type = _split_tag(tag, scheme)
        # A non-O previous word always belongs to an open entity, so `start` is set here.
        if prev_prefix != OUTSIDE and _ends_entity(prev_prefix, prefix, prev_type, entity_type):
            entities.append((prev_type, start, position))
            start = None
        if _starts_entity(prev_prefix, prefix, prev_type, entity_type):
            start = position
        prev_prefix, prev_type = prefix, entity_type
    if start is not None:
        entities.append((prev_type, start, len(tags)))
    return entities


def iob1_to_iob2(tags):
    """Rewrites IOB1 tags so that every entity starts with B-.

    Args:
      tags: IOB1 tag strings, shape [num_words].

    Returns:
      list of IOB2 tags with the same entities, e.g. ["I-PER", "I-PER", "B-PER", "O"]
      -> ["B-PER", "I-PER", "B-PER", "O"].
    """
    converted = []
    prev_type = ""
    for tag in tags:
        prefix, entity_type = _split_tag(tag, "IOB1")
        if prefix == "I" and entity_type != prev_type:  # prev_type is "" after O
            tag = "B-" + entity_type
        converted.append(tag)
        prev_type = entity_type
    return converted


def _precision_recall_f1(num_correct, num_predicted, num_true):
    """(precision, recall, F1), each 0.0 when its denominator is 0."""
    precision = num_correct / num_predicted if num_predicted else 0.0
    recall = num_correct / num_true if num_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_f1(true_seqs, pred_seqs, scheme="IOB2"):
    """Micro-averaged entity precision, recall and F1 over sentences, and per entity type.

    Args:
      true_seqs: list of gold tag sequences, one per sentence.
      pred_seqs: list of predicted tag sequences, each as long as its gold sequence.
      scheme: see `get_entities`; both sides are read with it.

    Returns:
      dict with "precision", "recall", "f1" (fractions in [0, 1]), "num_true",
      "num_predicted", "num_correct", and "per_type": {type: {"precision", "recall", "f1",
      "support"}} for every type seen in gold or predictions (support = gold entities).

    Raises:
      ValueError: different numbers of sentences or words, or a bad tag.
    """
    if len(true_seqs) != len(pred_seqs):
        raise ValueError(
            f"true_seqs has {len(true_seqs)} sentences but pred_seqs has {len(pred_seqs)}")
    true_entities, pred_entities = set(), set()
    for index, (true_tags, pred_tags) in enumerate(zip(true_seqs, pred_seqs, strict=True)):
        if len(true_tags) != len(pred_tags):
            raise ValueError(
                f"sentence {index}: true_seqs has {len(true_tags)} tags but pred_seqs has "
                f"{len(pred_tags)}")
        # The sentence index keeps identical spans of different sentences apart.
        true_entities.update((index, *e) for e in get_entities(true_tags, scheme))
        pred_entities.update((index, *e) for e in get_entities(pred_tags, scheme))
    correct = true_entities & pred_entities
    result = dict(zip(("precision", "recall", "f1"), _precision_recall_f1(
        len(correct), len(pred_entities), len(true_entities)), strict=True))
    result.update(num_true=len(true_entities), num_predicted=len(pred_entities),
                  num_correct=len(correct))
    counts = {name: collections.Counter(e[1] for e in entities)
              for name, entities in (("true", true_entities), ("pred", pred_entities),
                                     ("correct", correct))}
    result["per_type"] = {}
    for entity_type in sorted(set(counts["true"]) | set(counts["pred"])):
        scores = _precision_recall_f1(counts["correct"][entity_type],
                                      counts["pred"][entity_type], counts["true"][entity_type])
        result["per_type"][entity_type] = dict(
            zip(("precision", "recall", "f1"), scores, strict=True),
            support=counts["true"][entity_type])
    return result


def _locate_words(words, text):
    """[(start, end)] character spans of `words` found in order in `text`."""
    offsets, cursor = [], 0
    for word in words:
        start = text.find(word, cursor)
        if start < 0:
            raise ValueError(f"word {word!r} is not in text after character {cursor}")
        cursor = start + len(word)
        offsets.append((start, cursor))
    return offsets


def tags_to_entities(words, tags, char_offsets=None, *, text=None, scheme="IOB2"):
    """Word-level entities with character spans, for prediction output.

    Args:
      words: list of words, shape [num_words].
      tags: their predicted tags, shape [num_words].
      char_offsets: optional [(start, end)] per word, `end` exclusive, into the original text.
        Without it the words are located in `text`, or, without `text`, in " ".join(words).
      text: optional original text; when given, an entity's "text" is its exact slice.
      scheme: see `get_entities`.

    Returns:
      list of {"type", "text", "start", "end"}: character `start`/`end` (exclusive) of the
      entity; "text" is text[start:end], or its words joined by spaces when only
      `char_offsets` is given.

    Raises:
      ValueError: lengths differ, or a word cannot be found in `text`.
    """
    if len(words) != len(tags):
        raise ValueError(f"words has {len(words)} items but tags has {len(tags)}")
    if char_offsets is None:
        if text is None:
            text = " ".join(words)
        char_offsets = _locate_words(words, text)
    elif len(char_offsets) != len(words):
        raise ValueError(
            f"char_offsets has {len(char_offsets)} items but words has {len(words)}")
    entities = []
    for entity_type, start, end in get_entities(tags, scheme):
        char_start, char_end = char_offsets[start][0], char_offsets[end - 1][1]
        entity_text = (text[char_start:char_end] if text is not None
                       else " ".join(words[start:end]))
        entities.append(
            {"type": entity_type, "text": entity_text, "start": char_start, "end": char_end})
    return entities
