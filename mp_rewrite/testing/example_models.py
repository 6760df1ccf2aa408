"""Small and benchmark-size Keras 3 models for the example graphs (see ``mp_rewrite.testing.examples``).

Every builder resets Keras' global naming state and seeds, so the same call gives the same layer names, node names
and weights in any process, whatever was built before. Small models get trained-like values for their biases and
normalization statistics (fresh ones are zeros and ones, which TF would fold away).
"""

from __future__ import annotations

import os
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SEED = 1234


def _fresh_keras_state() -> None:
    # Keras numbers auto-named layers from a process-wide counter ("dense_3"); resetting it (and the seed) makes
    # every builder give the same node names and weights however many models were built before.
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(SEED)


class FusedBatchNormalization(keras.layers.BatchNormalization):
    """``BatchNormalization`` computed with TF's fused kernel, as tf.keras (Keras 2) did.

    Keras 3 lowers ``BatchNormalization`` to Mul/Add/Rsqrt (plus Mean/Square for batch statistics); the
    ``FusedBatchNormV3`` / ``FusedBatchNormGradV3`` ops that real TF models and Grappler's own tests have (with
    their two type attributes ``T`` and ``U``) only appear through ``tf.compat.v1.nn.fused_batch_norm``.
    Only 4-D NHWC inputs with ``axis=-1`` are supported.
    """

    def call(self, inputs, training=None, mask=None):
        """Normalizes ``inputs``; in training updates the moving statistics."""
        if training:
            y, mean, var = tf.compat.v1.nn.fused_batch_norm(
                inputs, self.gamma, self.beta, epsilon=self.epsilon, is_training=True
            )
            m = self.momentum
            self.moving_mean.assign(self.moving_mean * m + mean * (1.0 - m))
            self.moving_variance.assign(self.moving_variance * m + var * (1.0 - m))
            return y
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            inputs, self.gamma, self.beta, mean=self.moving_mean, variance=self.moving_variance,
            epsilon=self.epsilon, is_training=False,
        )
        return y


def _randomize_statistics(model: keras.Model) -> keras.Model:
    # Fresh Keras weights have zero biases and identity normalization (gamma 1, beta 0, mean 0, variance 1);
    # TF then folds "x + 0" away and the numerics tests would not see those ops round. Give them seeded
    # trained-like values; kernels keep their Glorot initialization.
    rng = np.random.default_rng(SEED)
    for weight in model.weights:
        if "variance" in weight.path or "gamma" in weight.path:
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype(weight.dtype))
        elif len(weight.shape) <= 1:
            weight.assign(rng.normal(0.0, 0.1, weight.shape).astype(weight.dtype))
    return model


def cnn_bn(image_size: int = 16, channels: int = 3, classes: int = 10, fused: bool = True) -> keras.Model:
    """A small image classifier: Conv2D -> BatchNormalization -> ReLU -> MaxPool (twice) -> Dense.

    Args:
        image_size: height and width of the input images.
        channels: input channels.
        classes: number of output logits.
        fused: use :class:`FusedBatchNormalization` (``FusedBatchNormV3`` ops) instead of Keras 3's unfused
            ``BatchNormalization``.

    Returns:
        A ``keras.Model`` with seeded random weights, input ``image`` and a logits output.
    """
    _fresh_keras_state()
    bn = FusedBatchNormalization if fused else keras.layers.BatchNormalization
    x = inp = keras.Input((image_size, image_size, channels), name="image")
    for filters in (8, 16):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = bn()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    out = keras.layers.Dense(classes)(x)
    return _randomize_statistics(keras.Model(inp, out, name="cnn_bn"))


def mlp(features: int = 32, hidden: tuple[int, ...] = (64, 64), classes: int = 10) -> keras.Model:
    """A multilayer perceptron: Dense+ReLU layers and a logits Dense.

    Args:
        features: input width.
        hidden: widths of the hidden layers.
        classes: number of output logits.

    Returns:
        A ``keras.Model`` with input ``features``.
    """
    _fresh_keras_state()
    x = inp = keras.Input((features,), name="features")
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
    out = keras.layers.Dense(classes)(x)
    return _randomize_statistics(keras.Model(inp, out, name="mlp"))


def transformer_encoder(
    seq_len: int = 8, d_model: int = 32, heads: int = 4, ff: int = 64, classes: int = 10
) -> keras.Model:
    """One post-norm Transformer encoder block and a pooled classifier head.

    MultiHeadAttention (Einsum/Softmax) + residual + LayerNormalization, then a Dense-ReLU-Dense feed-forward
    network + residual + LayerNormalization, GlobalAveragePooling1D and a logits Dense.

    Args:
        seq_len: sequence length.
        d_model: model (embedding) width; the input is ``(seq_len, d_model)`` float features.
        heads: attention heads.
        ff: hidden width of the feed-forward network.
        classes: number of output logits.

    Returns:
        A ``keras.Model`` with input ``tokens``.
    """
    _fresh_keras_state()
    x = inp = keras.Input((seq_len, d_model), name="tokens")
    att = keras.layers.MultiHeadAttention(heads, d_model // heads)(x, x)
    x = keras.layers.LayerNormalization()(x + att)
    h = keras.layers.Dense(ff, activation="relu")(x)
    h = keras.layers.Dense(d_model)(h)
    x = keras.layers.LayerNormalization()(x + h)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(classes)(x)
    return _randomize_statistics(keras.Model(inp, out, name="transformer_encoder"))


TOKENS, VOCABULARY = 128, 8000  # the benchmark Transformer's sequence length and vocabulary


def token_transformer(layers: int = 4, d_model: int = 256, heads: int = 8, ff: int = 1024,
                      classes: int = 10) -> keras.Model:
    """The benchmarks' Transformer encoder (tools/bench_saved_model.py, bench_fusion.py, bench_training.py): int32
    token ids (TOKENS of them, ids below VOCABULARY) through an Embedding, `layers` post-norm encoder layers with a
    GELU feed-forward network, GlobalAveragePooling1D and a logits Dense. Fresh weights, biases zero."""
    tokens = keras.Input((TOKENS,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCABULARY, d_model)(tokens)
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)(x, x)
        x = keras.layers.LayerNormalization()(x + attention)
        hidden = keras.layers.Dense(d_model)(keras.layers.Dense(ff, activation="gelu")(x))
        x = keras.layers.LayerNormalization()(x + hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(classes)(pooled))


def masked_transformer(length: int | None = 16, vocabulary: int = 100) -> keras.Model:
    """Token ids and a padding mask [batch, tokens] (`length` None: left unknown, as keras-hub exports it); one
    attention layer masked on the query and the key rows, a LayerNorm, a GELU Dense, pooling and logits."""
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    mask = keras.Input((length,), dtype="int32", name="mask")
    x = keras.layers.Embedding(vocabulary, 16)(tokens)
    pair = keras.ops.cast(keras.ops.expand_dims(mask, 2) * keras.ops.expand_dims(mask, 1), "bool")
    x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(2, 8)(x, x, attention_mask=pair))
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(16, activation="gelu")(x))
    return keras.Model([tokens, mask], keras.layers.Dense(4)(pooled))


def save_tf_keras_transformer(path: str, length: int = 16, vocabulary: int = 100, d_model: int = 16, heads: int = 2,
                              layers: int = 1, ff: int = 0, classes: int = 4, pooled: bool = False) -> None:
    """Save, as tf_keras saves (`save_format="tf"`, keras_metadata.pb beside the SavedModel), a tf_keras Transformer
    encoder: token ids [batch, `length`] of a `vocabulary`, `layers` of attention (`heads` of d_model / heads) and
    LayerNorm, with a GELU FFN of `ff` units where ff > 0, then logits per token, or of the first token (`pooled`).
    tf_keras reads its embedding with a ResourceGather, and the body's output waits on it by a control input."""
    import tf_keras
    tf_keras.utils.set_random_seed(0)
    tokens = tf_keras.Input((length,), dtype="int32", name="tokens")
    x = tf_keras.layers.Embedding(vocabulary, d_model)(tokens)
    for _ in range(layers):
        x = tf_keras.layers.LayerNormalization()(x + tf_keras.layers.MultiHeadAttention(heads, d_model // heads)(x, x))
        if ff:
            hidden = tf_keras.layers.Dense(ff, activation="gelu")(x)
            x = tf_keras.layers.LayerNormalization()(x + tf_keras.layers.Dense(d_model)(hidden))
    logits = tf_keras.layers.Dense(classes)(x[:, 0] if pooled else x)
    tf_keras.Model(tokens, logits).save(path, save_format="tf")


def lstm(timesteps: int = 6, features: int = 8, units: int = 16, classes: int = 10) -> keras.Model:
    """A ``keras.layers.LSTM`` over a sequence and a logits Dense (a ``While`` loop with TensorLists).

    Args:
        timesteps: sequence length.
        features: input width per step.
        units: LSTM units.
        classes: number of output logits.

    Returns:
        A ``keras.Model`` with input ``sequence``.
    """
    _fresh_keras_state()
    inp = keras.Input((timesteps, features), name="sequence")
    x = keras.layers.LSTM(units)(inp)
    out = keras.layers.Dense(classes)(x)
    return _randomize_statistics(keras.Model(inp, out, name="lstm"))


def _application(constructor: Callable[..., keras.Model], image_size: int, classes: int) -> keras.Model:
    _fresh_keras_state()
    # Logits out (no softmax), so the training step's from_logits loss is what a user would write.
    return constructor(
        weights=None, input_shape=(image_size, image_size, 3), classes=classes, classifier_activation=None
    )


def resnet50(image_size: int = 224, classes: int = 1000) -> keras.Model:
    """``keras.applications.ResNet50`` with random weights and logits output (benchmark size, ~25M weights)."""
    return _application(keras.applications.ResNet50, image_size, classes)


def densenet121(image_size: int = 224, classes: int = 1000) -> keras.Model:
    """``keras.applications.DenseNet121`` with random weights and logits output (benchmark size)."""
    return _application(keras.applications.DenseNet121, image_size, classes)


def mobilenet_v2(image_size: int = 224, classes: int = 1000) -> keras.Model:
    """``keras.applications.MobileNetV2`` with random weights and logits output (DepthwiseConv2dNative ops)."""
    return _application(keras.applications.MobileNetV2, image_size, classes)
