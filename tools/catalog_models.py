"""The models tools/sweep_catalog.py converts: every keras-hub Backbone class that builds from a small config, Keras
applications that fit in ~100 MB at a small input size, tf_keras models and a TF1 export; and, run as a script, the
two things the sweep does in a process of their own for each:

    python tools/catalog_models.py build NAME DIR     export the model NAME as a SavedModel in DIR
    python tools/catalog_models.py time SOURCE COPY   the copy's wall time per call over the source's (batch 8)

keras-hub's backbones are built from their constructors with small values for the arguments they ask for, by
name (CONFIG: vocabulary 1000, 2 layers, hidden 128, 4 heads, 64x64 images); a class that needs other models to
build (an image encoder, a vision and a text encoder) or arguments no small default fits is listed with the reason
it was not built.
"""

from __future__ import annotations

import inspect
import json
import statistics
import sys
import time

# Arguments by name, the same for every backbone that asks for them.
CONFIG = {
    "vocabulary_size": 1000, "vocab_size": 1000, "text_vocab_size": 1000,
    "num_layers": 2, "num_hidden_layers": 2, "encoder_num_layers": 2, "decoder_num_layers": 2,
    "num_layers_enc": 2, "num_layers_dec": 2, "num_spatial_layers": 1, "num_temporal_layers": 1,
    "num_auxiliary_layers": 1, "depth": 2, "depth_single_blocks": 1,
    "num_heads": 4, "num_attention_heads": 4, "num_query_heads": 4, "encoder_num_heads": 4, "decoder_num_heads": 4,
    "num_key_value_heads": 2, "hidden_dim": 128, "hidden_size": 128, "text_hidden_size": 128, "embedding_dim": 128,
    "intermediate_dim": 256, "intermediate_size": 256, "mlp_dim": 256, "head_dim": 32, "head_size": 32,
    "moe_intermediate_dim": 64, "shared_expert_intermediate_dim": 64, "shared_expert_intermediate_size": 64,
    "num_experts": 4, "top_k": 2, "filter_dim": 64, "patch_size": 8, "image_size": 64, "image_shape": (64, 64, 3),
    "max_sequence_length": 64, "num_frames": 2,
}

_SMOLLM = {"attention_bias": False, "attention_dropout": 0.0, "rope_layer_enabled_list": [True, True],
           "layer_types": ["attention", "attention"], "mlp_bias": False, "layer_norm_epsilon": 1e-6,
           "max_position_embeddings": 64, "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
_T5GEMMA = {f"{side}_{key}": value for side in ("encoder", "decoder") for key, value in (
    ("hidden_dim", 64), ("intermediate_dim", 128), ("num_layers", 1), ("num_attention_heads", 2),
    ("num_key_value_heads", 1), ("head_dim", 32), ("layer_types", ["full_attention"]))}

# Per class: what the names above do not fit (lists per stage, CNN widths), or what its defaults make too big.
OVERRIDES = {
    "AlbertBackbone": {"embedding_dim": 64},
    "SwinTransformerBackbone": {"patch_size": 4, "embed_dim": 32, "depths": [2, 2], "num_heads": [2, 4],
                                "window_size": 4},
    "ResNetBackbone": {"input_conv_filters": [64], "input_conv_kernel_sizes": [3], "stackwise_num_filters": [64, 128],
                       "stackwise_num_blocks": [1, 1], "stackwise_num_strides": [1, 2], "block_type": "basic_block"},
    "VGGBackbone": {"stackwise_num_repeats": [1, 1], "stackwise_num_filters": [16, 32]},
    "DenseNetBackbone": {"stackwise_num_repeats": [2, 2]},
    "XceptionBackbone": {"stackwise_conv_filters": [[32, 64], [128, 128]], "stackwise_pooling": [False, True]},
    "CSPNetBackbone": {"stem_filters": 16, "stem_kernel_size": 3, "stem_strides": 2, "stackwise_depth": [1, 1],
                       "stackwise_strides": 2, "stackwise_num_filters": [32, 64], "block_type": "bottleneck_block",
                       "stage_type": "csp"},
    "ViTDetBackbone": {"global_attention_layer_indices": [1], "image_shape": (64, 64, 3), "window_size": 4},
    "CLIPVisionEncoder": {"image_shape": (64, 64, 3)},
    "PaliGemmaBackbone": {"vit_patch_size": 8, "vit_num_heads": 2, "vit_hidden_dim": 64, "vit_num_layers": 1},
    "SmolLMBackbone": _SMOLLM,
    "SmolLM3Backbone": _SMOLLM,
    "T5GemmaBackbone": _T5GEMMA,
    "T5Gemma2Backbone": _T5GEMMA,
    "MiTBackbone": {"layerwise_depths": [1, 1], "num_layers": 2, "layerwise_num_heads": [1, 2],
                    "layerwise_sr_ratios": [2, 1], "max_drop_path_rate": 0.0, "layerwise_patch_sizes": [7, 3],
                    "layerwise_strides": [4, 2], "hidden_dims": [16, 32]},
}

APPLICATIONS = {  # keras.applications constructor -> input size (weights=None, 10 classes)
    "MobileNetV2": 96, "MobileNetV3Small": 96, "ResNet50": 96, "ResNet50V2": 96, "DenseNet121": 96,
    "EfficientNetB0": 96, "EfficientNetV2B0": 96, "ConvNeXtTiny": 96, "Xception": 96, "InceptionV3": 96,
    "NASNetMobile": 96,
}
TF_KERAS = {"tf_keras MobileNetV2": 96, "tf_keras ResNet50": 96}
TF_KERAS_TOKENS = ("tf_keras Transformer",)  # built here: tf_keras has no Transformer of its own
TF1 = ("TF1 dense block",)
SIZE_LIMIT = 110 * 2 ** 20  # "fits in ~100 MB": ConvNeXt-Tiny's 106 MB in


def backbone_classes() -> list[str]:
    """The names of keras-hub's Backbone classes (keras_hub.models), sorted."""
    import keras_hub
    from keras_hub.src.models.backbone import Backbone
    return sorted(name for name in dir(keras_hub.models) if name != "Backbone"
                  and isinstance(getattr(keras_hub.models, name), type)
                  and issubclass(getattr(keras_hub.models, name), Backbone))


def catalog() -> list[dict]:
    """Every model of the sweep: {"name", "kind", "skip": reason or None}, without building any."""
    entries = []
    for name in backbone_classes():
        entries.append({"name": name, "kind": "keras-hub", "skip": _unbuildable(name)})
    entries += [{"name": n, "kind": "keras application", "skip": None} for n in APPLICATIONS]
    entries += [{"name": n, "kind": "tf_keras", "skip": None} for n in (*TF_KERAS, *TF_KERAS_TOKENS)]
    entries += [{"name": n, "kind": "TF1 export", "skip": None} for n in TF1]
    return entries


def _unbuildable(name: str) -> str | None:
    """Why the class is not built from a config here, or None."""
    import keras_hub
    parameters = inspect.signature(getattr(keras_hub.models, name).__init__).parameters
    needed = [p for p, v in parameters.items() if v.default is inspect.Parameter.empty
              and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL) and p != "self"]
    missing = [p for p in needed if p not in CONFIG and p not in OVERRIDES.get(name, {})]
    if missing:
        models = [p for p in missing if p.endswith(("encoder", "model", "backbone", "qformer", "vae")) or
                  p in ("clip_l", "clip_g", "detr_decoder", "mask_decoder")]
        if models:
            return f"needs other models to build ({', '.join(models)})"
        return f"needs arguments no small default fits ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})"
    return None


def build(name: str, directory: str) -> None:
    """Export the model `name` of the catalog as a SavedModel in `directory` (random weights, seed 0)."""
    import keras
    keras.utils.set_random_seed(0)
    if name in APPLICATIONS:
        size = APPLICATIONS[name]
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)
        _check_size(model)
        model.export(directory, verbose=False)
    elif name in TF_KERAS:
        import tensorflow as tf
        import tf_keras
        size = TF_KERAS[name]
        model = getattr(tf_keras.applications, name.split()[1])(weights=None, input_shape=(size, size, 3), classes=10)
        tf.saved_model.save(model, directory)
    elif name in TF_KERAS_TOKENS:  # 2 layers, d 64, 32 tokens of a 100-token vocabulary, the first token pooled
        from mp_rewrite.testing.example_models import save_tf_keras_transformer
        save_tf_keras_transformer(directory, length=32, d_model=64, heads=4, layers=2, ff=256, classes=10,
                                  pooled=True)
    elif name in TF1:
        _tf1_export(directory)
    else:
        import keras_hub
        cls = getattr(keras_hub.models, name)
        parameters = inspect.signature(cls.__init__).parameters
        config = {k: v for k, v in {**CONFIG, **OVERRIDES.get(name, {})}.items() if k in parameters}
        model = cls(**config)
        _check_size(model)
        model.export(directory, verbose=False)


def _check_size(model) -> None:
    size = sum(int(w.numpy().nbytes) for w in model.weights)
    if size > SIZE_LIMIT:
        raise SystemExit(f"skip: {size / 2 ** 20:.0f} MB of weights, over the sweep's {SIZE_LIMIT // 2 ** 20} MB")


def _tf1_export(directory: str) -> None:
    """A TF1 SavedModel (tf.compat.v1.saved_model.Builder) of two dense layers with ReLU and a residual, on ref
    variables, served by a 'serving_default' signature."""
    import numpy as np
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 64], name="x")
        rng = np.random.default_rng(0)
        h = x
        for i in range(2):
            w = v1.Variable(rng.standard_normal((64, 64)).astype(np.float32) * 0.1, name=f"w{i}", use_resource=False)
            b = v1.Variable(rng.standard_normal(64).astype(np.float32) * 0.1, name=f"b{i}", use_resource=False)
            h = tf.nn.relu(tf.matmul(h, w) + b) + h
        y = tf.identity(h, name="y")
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(directory)
            signature = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], {"serving_default": signature})
            builder.save()


def timed(source: str, copy: str, batch: int = 8, rounds: int = 7, block: float = 0.4) -> dict:
    """The copy's and the source's serving_default (or first signature), called alternately in blocks (ABAB) at
    `batch` on the same made-up inputs: {"source_ms", "copy_ms", "ratio"} (medians of the blocks, wall)."""
    import tensorflow as tf
    from mp_rewrite.savedmodel.inputs import signature_inputs
    functions = []
    for path in (source, copy):
        signatures = tf.saved_model.load(path).signatures
        key = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
        functions.append(signatures[key])
    arrays, _ = signature_inputs(key, functions[0].structured_input_signature[1], {}, batch, seed=0, dim=16,
                                 id_limit=100)
    feeds = {name: tf.constant(value) for name, value in arrays.items()}
    for function in functions:
        for _ in range(3):
            function(**feeds)
    times = ([], [])
    for _ in range(rounds):
        for which, function in enumerate(functions):
            start, calls = time.perf_counter(), 0
            while time.perf_counter() - start < block:
                function(**feeds)
                calls += 1
            times[which].append((time.perf_counter() - start) / calls * 1e3)
    source_ms, copy_ms = statistics.median(times[0]), statistics.median(times[1])
    return {"source_ms": source_ms, "copy_ms": copy_ms, "ratio": copy_ms / source_ms}


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "build":
        build(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "time":
        print(json.dumps(timed(argv[1], argv[2])))
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
