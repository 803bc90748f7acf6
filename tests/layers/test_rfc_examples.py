"""The three example programs of the keras-nlp "Transformer Encoder API" RFC, run as tests.

Source: keras-team/governance rfcs/20200920-keras-nlp-bert.md. The model code is kept as
the RFC writes it; the changes, each marked `# RFC:` with the original, are:
  * module names: `keras_nlp.*` -> `bert_trainer.*`, `tf.keras.*` -> `keras.*`
    (`tf.keras.layers.experimental.EinsumDense` -> `keras.layers.EinsumDense`),
    `TransformerEncoderBlock` -> `TransformerEncoder` (the class name the RFC gives it);
  * the RFC's typos (`emnbeddings`, `output`/`outputs`, `outputs={'lm_output': masked_lm}`)
    and its positional `BertEncoder(vocab_size, max_sequence_length, type_vocab_size)`,
    which would bind `hidden_size` and `num_layers`;
  * sizes: tiny encoders (the `SMALL` kwargs) so that a test trains in seconds on a CPU;
  * data: the IMDB/TFDS download and a gs:// vocabulary become in-memory token ids, the
    TPU strategy the default strategy, and `epochs` a few steps;
  * the MLM loss takes `from_logits=True`: `MaskedLM` outputs logits by default;
  * `compile`'s metrics by keyword: Keras 3's third positional argument is `loss_weights`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bert_trainer.encoders
import bert_trainer.layers
from bert_trainer import layers

SMALL = dict(hidden_size=32, num_layers=1, num_attention_heads=2, inner_dim=64)
SEQUENCE_LENGTH = 128


def _token_features(num_examples, seed=0):
    """Stand-in for the RFC's tokenized IMDB reviews: ids, mask and types [n, 128]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, SEQUENCE_LENGTH, num_examples)
    mask = (np.arange(SEQUENCE_LENGTH)[None] < lengths[:, None]).astype("int32")
    ids = rng.integers(1000, 30522, (num_examples, SEQUENCE_LENGTH)).astype("int32") * mask
    return {"input_ids": ids, "input_mask": mask, "input_type_ids": np.zeros_like(mask)}


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_classification_example(tmp_path):
    # A "pretrained" checkpoint for the example to restore.
    pretrained = bert_trainer.encoders.BertEncoder(
        vocab_size=30522, max_sequence_length=512, type_vocab_size=2, **SMALL)
    checkpoint_path = tf.train.Checkpoint(model=pretrained).save(str(tmp_path / "bert"))
    features = _token_features(32)
    labels = (features["input_ids"][:, 1] > 15000).astype("float32")
    train_ds = tf.data.Dataset.from_tensor_slices((features, labels)).batch(32)
    test_ds = train_ds

    strategy = tf.distribute.get_strategy()  # RFC: tf.distribute.TPUStrategy(...)
    with strategy.scope():
        encoder = bert_trainer.encoders.BertEncoder(
            vocab_size=30522, max_sequence_length=512, type_vocab_size=2, **SMALL)
        checkpoint = tf.train.Checkpoint(model=encoder)
        checkpoint.restore(checkpoint_path).assert_consumed().run_restore_ops()
        input_ids = keras.layers.Input(shape=(SEQUENCE_LENGTH,), name='input_ids', dtype=tf.int32)
        input_mask = keras.layers.Input(shape=(SEQUENCE_LENGTH,), name='input_mask', dtype=tf.int32)
        label_ids = keras.layers.Input(shape=(128,), name='input_type_ids', dtype=tf.int32)
        x = encoder([input_ids, input_mask, label_ids])['pooled_output']
        x = keras.layers.Dropout(rate=0.1)(x)
        output = keras.layers.Dense(1, activation='sigmoid')(x)
        model = keras.Model(inputs=[input_ids, input_mask, label_ids], outputs=output)

    # The restore loaded the checkpoint's values.
    for restored, saved in zip(encoder.weights, pretrained.weights, strict=True):
        np.testing.assert_array_equal(restored.numpy(), saved.numpy())
    # RFC: ['accuracy'] positionally (Keras 3's third argument is loss_weights).
    model.compile('adam', 'binary_crossentropy', metrics=['accuracy'])
    history = model.fit(train_ds, epochs=5, validation_data=test_ds, verbose=0)  # RFC: epochs=5
    assert model.predict(test_ds, verbose=0).shape == (32, 1)
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_pretraining_example():
    vocab_size, max_sequence_length, type_vocab_size, num_classes = 30522, 512, 2, 2
    features = _token_features(16)
    features["masked_lm_positions"] = np.tile(np.arange(1, 6, dtype="int32"), (16, 1))
    masked_ids = np.take_along_axis(features["input_ids"], features["masked_lm_positions"], 1)
    targets = {"lm_output": masked_ids, "cls_output": np.arange(16) % 2}
    train_ds = tf.data.Dataset.from_tensor_slices((features, targets)).batch(8)
    strategy = tf.distribute.get_strategy()

    with strategy.scope():
        # RFC: BertEncoder(vocab_size, max_sequence_length, type_vocab_size), positionally.
        encoder = bert_trainer.encoders.BertEncoder(
            vocab_size=vocab_size, max_sequence_length=max_sequence_length,
            type_vocab_size=type_vocab_size, **SMALL)
        input_ids = keras.layers.Input(shape=(SEQUENCE_LENGTH,), name='input_ids', dtype=tf.int32)
        input_mask = keras.layers.Input(shape=(SEQUENCE_LENGTH,), name='input_mask', dtype=tf.int32)
        label_ids = keras.layers.Input(shape=(128,), name='input_type_ids', dtype=tf.int32)
        masked_lm_positions = keras.layers.Input(
            shape=(None,), name='masked_lm_positions', dtype=tf.int32)
        # RFC: x = encoder(...)['pooled_output'], then output['pooled_output'] (typos).
        outputs = encoder([input_ids, input_mask, label_ids])
        cls_output, sequence_output = outputs['pooled_output'], outputs['sequence_output']
        masked_lm = bert_trainer.layers.MaskedLM(embedding_table=encoder.get_embedding_table())
        lm_output = masked_lm(sequence_output, masked_positions=masked_lm_positions)
        cls_output = keras.layers.Dense(units=num_classes, activation='softmax')(cls_output)
        # RFC: outputs={'lm_output': masked_lm, ...} (the layer instead of its output).
        model = keras.Model(inputs=[input_ids, input_mask, label_ids, masked_lm_positions],
                            outputs={'lm_output': lm_output, 'cls_output': cls_output})

    # RFC: 'sparse_categorical_crossentropy' for lm_output, but MaskedLM returns logits.
    mlm_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile('adam', {'lm_output': mlm_loss,
                           'cls_output': 'sparse_categorical_crossentropy'})
    table = encoder.get_embedding_table()
    before = table.numpy()
    history = model.fit(train_ds, epochs=3, verbose=0)  # RFC: epochs=100
    assert masked_lm.embedding_table is table
    # The tied table is counted once; the NSP dense adds 32 x 2 + 2.
    mlm_own = masked_lm.count_params() - table.numpy().size
    assert model.count_params() == encoder.count_params() + mlm_own + 32 * 2 + 2
    assert not np.allclose(table.numpy(), before)  # the tied table is trained
    assert history.history["loss"][-1] < history.history["loss"][0]


def _rfc_albert(vocab_size, embedding_width, max_sequence_length, type_vocab_size, dropout_rate,
                hidden_size, num_attention_heads, inner_dim, num_layers):
    """The RFC's ALBERT composition from layers (its free variables become arguments)."""
    word_ids = keras.layers.Input(shape=(None,), dtype=tf.int32, name='input_word_ids')
    mask = keras.layers.Input(shape=(None,), dtype=tf.int32, name='input_mask')
    type_ids = keras.layers.Input(shape=(None,), dtype=tf.int32, name='input_type_ids')
    embedding_layer = bert_trainer.layers.OnDeviceEmbedding(vocab_size, embedding_width)
    word_embeddings = embedding_layer(word_ids)
    position_embedding_layer = bert_trainer.layers.PositionEmbedding(max_sequence_length)
    position_embeddings = position_embedding_layer(word_embeddings)
    type_embeddings = bert_trainer.layers.OnDeviceEmbedding(
      vocab_size=type_vocab_size, embedding_width=embedding_width, use_one_hot=True)(type_ids)
    embeddings = keras.layers.Add()([word_embeddings, position_embeddings, type_embeddings])
    embeddings = keras.layers.LayerNormalization(axis=-1)(embeddings)
    embeddings = keras.layers.Dropout(rate=dropout_rate)(embeddings)
    embeddings = keras.layers.EinsumDense(  # RFC: tf.keras.layers.experimental.EinsumDense
      '...x,xy->...y', output_shape=hidden_size, bias_axes='y')(embeddings)
    data = embeddings  # RFC: emnbeddings
    attention_mask = layers.SelfAttentionMask()([data, mask])
    # RFC: keras_nlp.layers.TransformerEncoderBlock
    shared_layer = bert_trainer.layers.TransformerEncoder(num_attention_heads, inner_dim)
    for _ in range(num_layers):
      data = shared_layer([data, attention_mask])
    first_token_tensor = keras.layers.Lambda(lambda x: tf.squeeze(x[:, 0:1, :], axis=1))(data)
    cls_output = keras.layers.Dense(units=hidden_size, activation='tanh')(first_token_tensor)
    outputs = dict(sequence_output=data, pooled_output=cls_output)
    model = keras.Model(inputs=[word_ids, mask, type_ids], outputs=outputs)
    return model


def _copy_rfc_weights_into(albert, model):
    """Pairs the RFC model's layers with AlbertEncoder's public sublayers."""
    by_type = lambda cls: [layer for layer in model.layers if isinstance(layer, cls)]  # noqa: E731
    embeddings = sorted(by_type(bert_trainer.layers.OnDeviceEmbedding), key=lambda e: -e.vocab_size)
    pairs = [(albert.word_embeddings, embeddings[0]), (albert.type_embeddings, embeddings[1]),
             (albert.position_embedding, by_type(bert_trainer.layers.PositionEmbedding)[0]),
             (albert.embeddings_layer_norm, by_type(keras.layers.LayerNormalization)[0]),
             (albert.embedding_projection, by_type(keras.layers.EinsumDense)[0]),
             (albert.transformer_layers[0], by_type(bert_trainer.layers.TransformerEncoder)[0]),
             (albert.pooler_transform, by_type(keras.layers.Dense)[0])]
    for ours, theirs in pairs:
        ours.set_weights(theirs.get_weights())
    return pairs


def test_albert_composition_example_equals_albert_encoder():
    sizes = dict(vocab_size=100, embedding_width=8, max_sequence_length=16, type_vocab_size=2,
                 hidden_size=32, num_attention_heads=2, inner_dim=64, num_layers=3)
    model = _rfc_albert(dropout_rate=0.1, **sizes)
    albert = bert_trainer.encoders.AlbertEncoder(**sizes, inner_activation="gelu",
                                                 output_dropout=0.1, attention_dropout=0.0)
    assert model.count_params() == albert.count_params()
    pairs = _copy_rfc_weights_into(albert, model)
    # The RFC's LayerNormalization keeps Keras' default epsilon (1e-3); BERT's is 1e-12.
    pairs[3][1].epsilon = 1e-12
    rng = np.random.default_rng(0)
    mask = np.array([[1] * 10, [1] * 6 + [0] * 4], "int32")
    inputs = [rng.integers(0, 100, (2, 10)).astype("int32"), mask,
              (np.arange(10)[None] > 4).astype("int32").repeat(2, 0)]
    expected, actual = albert(inputs), model(inputs)
    np.testing.assert_allclose(actual["sequence_output"], expected["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(actual["pooled_output"], expected["pooled_output"], atol=1e-5)
