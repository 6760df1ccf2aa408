"""Example models and TensorFlow's own pass as an oracle, for tests, benchmarks and the demo (the library proper never imports it)."""
