"""A small SavedModel shared by the reliability tests: two variables, a nested tf.function, one signature."""

from __future__ import annotations

import pytest
import tensorflow as tf


class Scorer(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([16, 16], seed=[1, 2]))
        self.b = tf.Variable(tf.zeros([16]))

    @tf.function
    def inner(self, x):
        return tf.nn.relu(tf.matmul(x, self.w) + self.b)

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.nn.softmax(self.inner(x))}


@pytest.fixture(scope="session")
def source(tmp_path_factory):
    """The SavedModel directory (tests only read it; they check its hash)."""
    path = tmp_path_factory.mktemp("reliability") / "scorer"
    module = Scorer()
    tf.saved_model.save(module, str(path), signatures=module.__call__)
    return path


class Looper(tf.Module):
    """Functional control flow (a While whose body and cond are library functions) around a Keras layer."""

    def __init__(self):
        import keras
        self.dense = keras.layers.Dense(16, activation="tanh")
        self.dense.build((None, 16))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x):
        _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, self.dense(h)), (tf.constant(0), x))
        return {"y": tf.nn.softmax(h)}


@pytest.fixture(scope="session")
def looper(tmp_path_factory):
    """A SavedModel with a While loop and a Keras layer (tests only read it)."""
    path = tmp_path_factory.mktemp("reliability") / "looper"
    module = Looper()
    tf.saved_model.save(module, str(path), signatures=module.__call__)
    return path
