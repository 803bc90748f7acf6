"""How a model's variables are named in a checkpoint, and how either naming is read back.

Stable layout (bert-train format 2): the checkpoint's `model` object has one child per
weight, named after the Keras variable path, the encoder's under `encoder/`:

    model/encoder/word_embeddings/embeddings
    model/encoder/transformer_layer_0/attention/query/kernel
    model/masked_lm/bias                       (a head: its layer name, then the path)

TensorFlow escapes "/" in a child name as ".S" inside the flat checkpoint key
(`model/encoder.Sword_embeddings.Sembeddings/.ATTRIBUTES/VARIABLE_VALUE`, see
`checkpoint_key`); the object graph keeps the plain name. The names depend only on layer
names, never on the order in which a functional model records its operations, so changing
the encoder's code cannot renumber them. All children sit directly under `model` (depth 2),
so every model variable is saved under its name even when the optimizer also references it
(`optimizer/_trainable_variables/N` is one level deeper and loses the breadth-first walk that
names checkpoint keys).

Object-graph layout (format 1, bert-train before this module): `model` was the Keras model
itself, so encoder variables were reached through `encoder/_operations/N/...`. Such
checkpoints are still read for warm starts by walking their object graph with the live
model (`match_variables`), which is exact as long as the encoder's op list is unchanged.
"""

import collections

import keras
import tensorflow as tf
from google.protobuf import message
from tensorflow.core.protobuf import trackable_object_graph_pb2

from bert_trainer.errors import UserError

ENCODER = "encoder"
STABLE, OBJECT_GRAPH = "stable", "object_graph"
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class NamedVariables(tf.__internal__.tracking.Trackable):
    """A checkpointable node whose children are variables under stable names.

    Attributes:
      variables: {name: variable}, in the order they are saved.
      keras_model: the model the names were taken from (None for loose parts); not saved.
    """

    def __init__(self, variables: dict, keras_model=None):
        self.variables = dict(variables)
        self.keras_model = keras_model
        for name, variable in self.variables.items():
            self._track_trackable(variable, name=name)


def variable_names(model: keras.Model) -> dict[str, object]:
    """{stable name: variable} for every weight of `model` (see the module docstring).

    A model with an `encoder` attribute (every bert-train task model) names the encoder's
    weights `encoder/<path>`; its other weights (the heads) keep their Keras path.

    Raises:
      ValueError: two weights share a name (give the layers distinct explicit names).
    """
    encoder = getattr(model, ENCODER, None)
    if not isinstance(encoder, keras.Model) or encoder is model:
        return _name_weights([], model.weights)
    return _name_weights(encoder.weights, model.weights)


def parts_names(encoder: keras.Model, heads: dict) -> dict[str, object]:
    """{stable name: variable} for an encoder and pretraining heads held apart.

    The names equal those `variable_names` gives a model holding the same layers, as long as
    each head layer is named after its key (`masked_lm`, `next_sentence`).

    Args:
      encoder: a built encoder.
      heads: {part name: built head layer}; a variable shared with the encoder (the tied
        embedding table) keeps its encoder name.

    Raises:
      ValueError: a head whose variables are not named `<part name>/...`.
    """
    taken = {id(v) for v in encoder.weights}
    head_weights = []
    for part, head in heads.items():
        own = [v for v in head.weights if id(v) not in taken]
        stray = [v.path for v in own if not v.path.startswith(f"{part}/")]
        if stray:
            raise ValueError(f"head {part!r} holds {stray[0]}; name the layer {part!r} so its "
                             "variables match the checkpoint's names")
        head_weights.extend(own)
    return _name_weights(encoder.weights, head_weights)


def _name_weights(encoder_weights, other_weights) -> dict[str, object]:
    names, seen = {}, set()
    for prefix, weights in ((f"{ENCODER}/", encoder_weights), ("", other_weights)):
        for variable in weights:
            if id(variable) in seen:
                continue
            seen.add(id(variable))
            name = prefix + variable.path
            if name in names:
                raise ValueError(f"two variables are named {name}; give their layers distinct "
                                 "explicit names")
            names[name] = variable
    return names


def model_trackable(model: keras.Model) -> NamedVariables:
    """What a checkpoint root holds for `model`: `tf.train.Checkpoint(model=model_trackable(m))`."""
    return NamedVariables(variable_names(model), keras_model=model)


def checkpoint_key(name: str) -> str:
    """The flat checkpoint key of the model variable `name` saved under a root's `model`."""
    escaped = name.replace(".", "..").replace("/", ".S")  # TensorFlow's escape_local_name
    return f"model/{escaped}{_VALUE_SUFFIX}"


# ------------------------------------------------------------------------------ reading


def read_object_graph(prefix: str):
    """The checkpoint's object graph proto and {key: shape}; UserError for TF1 checkpoints."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        serialized = reader.get_tensor(_OBJECT_GRAPH_KEY)
    except tf.errors.NotFoundError:
        raise UserError(f"{prefix} is a name-based (TF1-style) checkpoint without an object "
                        "graph; convert it first with 'bert-train convert --input=DIR'") from None
    except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a truncated file
        raise UserError(f"{prefix} could not be read as a checkpoint ({e})") from None
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    try:
        graph.ParseFromString(serialized)
    except message.DecodeError as e:
        raise UserError(f"{prefix} could not be read as a checkpoint: its object graph is "
                        f"corrupt ({e}); use another checkpoint or retrain") from None
    return graph, reader.get_variable_to_shape_map()


def _child(graph, node_id: int, name: str) -> int | None:
    return next((ref.node_id for ref in graph.nodes[node_id].children
                 if ref.local_name == name), None)


def layout(graph) -> str | None:
    """STABLE or OBJECT_GRAPH for a checkpoint whose root has `model`; None without one.

    Every stable name holds a "/" (a Keras path is at least `layer/variable`), while the
    object-graph layout's children are Python attribute names, which never do.
    """
    model = _child(graph, 0, "model")
    if model is None:
        return None
    names = [ref.local_name for ref in graph.nodes[model].children]
    return STABLE if names and all("/" in name for name in names) else OBJECT_GRAPH


def stored_names(graph, shapes) -> dict[str, tuple[str, tuple]]:
    """{stable name: (checkpoint key, shape)} of a stable-layout checkpoint's model variables."""
    model = _child(graph, 0, "model")
    stored = {}
    for ref in graph.nodes[model].children if model is not None else ():
        for attribute in graph.nodes[ref.node_id].attributes:
            if attribute.name == "VARIABLE_VALUE" and attribute.checkpoint_key in shapes:
                stored[ref.local_name] = (attribute.checkpoint_key,
                                          tuple(shapes[attribute.checkpoint_key]))
    return stored


def match_variables(graph, shapes, root) -> list[tuple[str, tuple, object]]:
    """Pairs each checkpointed variable with the live variable a restore would assign it to.

    Walks the checkpoint's object graph and the live object graph of `root` together by
    child name, which is how tf.train.Checkpoint itself matches objects, so the pairs are
    exact for either layout, even when one object is reachable along several paths.

    Returns:
      (checkpoint key, checkpoint shape, live variable) for every match.
    """
    matched, seen, queue = [], set(), collections.deque([(0, root)])
    while queue:  # Breadth first, the order in which the checkpoint was written.
        node_id, obj = queue.popleft()
        if node_id in seen:
            continue
        seen.add(node_id)
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE" and attribute.checkpoint_key in shapes:
                key = attribute.checkpoint_key
                matched.append((key, tuple(shapes[key]), obj))
        # `_trackable_children` is the Trackable API that tf.train.Checkpoint uses to match.
        children = obj._trackable_children()
        for ref in node.children:
            if ref.local_name in children:
                queue.append((ref.node_id, children[ref.local_name]))
    return matched


def subtree_keys(graph, path: tuple[str, ...]) -> set[str]:
    """Checkpoint keys of every variable reachable from the object at `path` (child names)."""
    node_id = 0
    for name in path:
        node_id = _child(graph, node_id, name)
        if node_id is None:
            return set()
    keys, seen, queue = set(), set(), collections.deque([node_id])
    while queue:
        node_id = queue.popleft()
        if node_id in seen:
            continue
        seen.add(node_id)
        node = graph.nodes[node_id]
        keys.update(a.checkpoint_key for a in node.attributes if a.name == "VARIABLE_VALUE")
        queue.extend(ref.node_id for ref in node.children)
    return keys


def check_shapes(prefix: str, matched, names: dict[int, str]) -> None:
    """UserError (one line, both shapes) for the first matched variable whose shape differs.

    Args:
      prefix: the checkpoint, named in the message.
      matched: `match_variables` pairs.
      names: {id(variable): stable name} used to name the variable.
    """
    for key, shape, variable in matched:
        if tuple(shape) != tuple(variable.shape):
            name = names.get(id(variable), getattr(variable, "path", key))
            raise UserError(f"{prefix}: {name} is {list(shape)} in the checkpoint but "
                            f"{list(variable.shape)} in the model; the checkpoint is of another "
                            "architecture (check the encoder config)")


def model_root(model: keras.Model, graph) -> tf.train.Checkpoint:
    """The root to read a checkpoint into `model`, in the checkpoint's own layout."""
    if layout(graph) == OBJECT_GRAPH:
        return tf.train.Checkpoint(model=model)
    return tf.train.Checkpoint(model=model_trackable(model))


def restore_model(model: keras.Model, prefix: str) -> None:
    """Restores every weight of `model` from a checkpoint of either layout.

    Everything else the checkpoint holds (optimizer, step) is ignored.

    Raises:
      UserError: a weight the checkpoint lacks or whose shape differs, named in one line;
        nothing is restored then.
    """
    graph, shapes = read_object_graph(prefix)
    root = model_root(model, graph)
    names = {id(v): name for name, v in variable_names(model).items()}
    matched = match_variables(graph, shapes, root)
    check_shapes(prefix, matched, names)
    found = {id(v) for _, _, v in matched}
    missing = [name for name, v in variable_names(model).items() if id(v) not in found]
    if missing:
        raise UserError(f"{prefix} has no value for {missing[0]} ({len(missing)} of the "
                        f"model's {len(names)} variables are missing)")
    root.read(prefix).expect_partial()


def refuse_resume_across_layouts(checkpoint: tf.train.Checkpoint, path: str,
                                 model_dir: str) -> None:
    """Refuses to resume a stable-names run from an object-graph (pre-format-2) checkpoint.

    Its optimizer slots cannot be matched to the model; its weights can still warm-start.

    Raises:
        UserError: the layouts differ; the message says how to carry the weights over.
    """
    if not isinstance(getattr(checkpoint, "model", None), NamedVariables):
        return
    graph, _ = read_object_graph(path)
    if layout(graph) == OBJECT_GRAPH:
        raise UserError(f"model_dir {model_dir}: {path} was written by an older bert-train "
                        "(object-graph variable names) and cannot be resumed; finish the run "
                        "with that version, or start a new --model_dir with "
                        f"--init_checkpoint={path}")
