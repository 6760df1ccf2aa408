"""Loss scaling: `LossScaleOptimizer` (optimizer.py), a drop-in for tf_keras's and Keras 3's, split by concern:

    optimizer.py          the optimizer: scaling, unscaling, apply
    dynamic_scale.py      the dynamic loss-scale update
    settings.py           its settings, bounds and serialization
    checkpoint_layout.py  the peers' checkpoint layouts (tf_keras v2/v3, Keras 3)
    scaling_contract.py   tf_keras's and Keras 3's apply_gradients contracts
    delegation.py         what is delegated to the inner optimizer
    legacy_methods.py     tf_keras's legacy optimizer methods
    tf_keras_compile.py   tf_keras's Model.compile accepting it
"""
