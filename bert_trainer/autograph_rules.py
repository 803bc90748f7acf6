"""Which code AutoGraph leaves as it is when a `tf.function` or a `tf.data` map is traced.

AutoGraph rewrites every Python function a traced function calls (parses its source, converts
`if`/`for`/`while` on tensors to graph control flow, compiles the result), once per function
and process. TensorFlow's own rules skip TensorFlow and Keras, but not tensorflow-text, nor
this package: a 4-step fine-tune spent a third of its CPU time (3.5 of 10.9 s, 63 functions)
converting tokenizer ops, layers and models that have no Python control flow on tensors, and
every new process (each command, each worker) paid it again.

Importing this module adds rules that call these modules as written:
- `tensorflow_text`: its ops are written for graph mode (they use `tf.cond`/`tf.while_loop`
  themselves, as TensorFlow 1 graphs need);
- this package's traced code: the layer library and the models (`bert_trainer.layers`,
  `.heads`, `.encoders`, `.models`, `.ops`), the training loop, evaluation and optimizer
  (`.training`), the input pipelines' map functions (`.data`, `.tasks`) and the tasks' losses
  and metrics (`.tasks`). Their loops are explicit `tf.while_loop`s, their tensor branches
  `tf.cond`/`tf.where`, and their Python `if`s test Python values (shapes, settings), never
  tensors. The training loop's `tf.function` is made with `autograph=False` for the same
  reason.
Code outside the package (a plugin family, a user's own task) is converted as usual. A
function of these modules that branches on a tensor fails when traced ("using a tf.Tensor as
a Python bool is not allowed"): write the branch with `tf.cond`.
"""

from tensorflow.python.autograph.core import config

AS_WRITTEN = ("tensorflow_text", "bert_trainer.layers", "bert_trainer.heads",
              "bert_trainer.encoders", "bert_trainer.models", "bert_trainer.ops",
              "bert_trainer.training", "bert_trainer.data", "bert_trainer.tasks")

_present = {str(rule) for rule in config.CONVERSION_RULES}
config.CONVERSION_RULES = (*(rule for rule in map(config.DoNotConvert, AS_WRITTEN)
                             if str(rule) not in _present), *config.CONVERSION_RULES)
