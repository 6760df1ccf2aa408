"""Shared test set-up: quiet TensorFlow, fixed seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
