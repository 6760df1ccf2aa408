"""The models tools/bench_saved_model.py times, and the conversions it times them in: each model built and
exported (random weights, BatchNorm statistics and biases made non-trivial), then converted into every variant
the benchmark compares (in place with the lists, with and without --split 2, --freeze, --freeze --split 2, the
cost assignment in place and
frozen, --tune, matmul/conv only, Intel Neural Compressor's in its own Python).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("fp32", "ours", "ours_any", "ours_lists", "ours_lists_split", "ours_freeze", "ours_split",
            "ours_split_auto", "ours_cost", "ours_tuned", "tf_amp", "keras_mixed", "ours_mm")
PEERS = ("inc", "openvino")  # each only if its Python is given
TUNE_BATCH = 8
# An extra variant, not Grappler's lists: only the allow ops (matmul/conv) in bf16, every elementwise op float32.
MATMUL_CONV_ONLY = "[infer]\nops = []\n[clear]\nops = []\n"
MODELS = {"resnet50": "Keras ResNet-50 (224x224)", "mobilenetv2": "Keras MobileNetV2 (224x224)",
          "efficientnetb0": "Keras EfficientNetB0 (224x224)",
          "transformer": "Transformer encoder (4 layers, d=256, 8 heads, seq 128)",
          "bert": "keras-hub BertBackbone, BERT-mini shape (4 layers, d=256, 4 heads, ffn 1024, vocab 30522, seq 128)",
          "gpt2": "keras-hub GPT2Backbone (4 layers, d=256, 4 heads, ffn 1024, vocab 50257, seq 128)",
          "vit": "keras-hub ViTBackbone, ViT-Tiny/16 shape (224x224, 12 layers, d=192, 3 heads, mlp 768)"}
DEFAULT_MODELS = ("resnet50", "mobilenetv2", "efficientnetb0", "transformer")
KERAS_HUB = ("bert", "gpt2")  # token models: exported at a fixed sequence length
RANDOM_BIASES = (*KERAS_HUB, "vit")  # keras-hub backbones: biases and betas zero when built (with_random_biases)
SEQUENCE = 128  # keras-hub backbones take (batch, any length): exported with this length


def build_model(name: str):
    """The Keras model `name` with random weights, in the current dtype policy."""
    import keras
    keras.utils.set_random_seed(0)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None)
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None)
    if name == "efficientnetb0":
        return keras.applications.EfficientNetB0(weights=None)
    if name == "vit":
        import keras_hub
        return keras_hub.models.ViTBackbone(image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=3,
                                            hidden_dim=192, mlp_dim=768)
    if name in KERAS_HUB:
        import keras_hub
        size = dict(num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=SEQUENCE)
        if name == "bert":
            return keras_hub.models.BertBackbone(vocabulary_size=30522, **size)
        return keras_hub.models.GPT2Backbone(vocabulary_size=50257, **size)
    from mp_rewrite.testing.example_models import token_transformer
    return token_transformer()


def with_random_biases(model):
    """Every bias (and LayerNormalization beta) of a nested model, e.g. a keras-hub backbone, set to small random
    values: they are zeros when freshly built, which Grappler would fold away."""
    import numpy as np
    rng = np.random.default_rng(1)
    for weight in model.weights:
        if weight.path.rsplit("/", 1)[-1] in ("bias", "beta"):
            weight.assign(rng.normal(0, 0.05, tuple(weight.shape)).astype("float32"))
    return model


def export(name: str, model, path: Path) -> None:
    """`model.export` (the serving signature); keras-hub backbones with a fixed sequence length."""
    signature = None
    if name in KERAS_HUB:
        import tensorflow as tf
        signature = [{i.name: tf.TensorSpec((None, SEQUENCE), i.dtype, name=i.name) for i in model.inputs}]
    model.export(str(path), verbose=False, input_signature=signature)


def with_statistics(model):
    """Give every BatchNormalization and bias the values a trained model has: a freshly initialised one has zero
    biases and identity normalizations, which Grappler folds away and which would flatter every frozen variant."""
    import keras
    import numpy as np
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 2, variance.shape)])
        elif getattr(layer, "use_bias", False) and len(layer.get_weights()) == 2:
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, rng.normal(0, 0.05, bias.shape)])
    return model


def prepare(name: str, workdir: Path, inc_python: str | None, openvino_python: str | None = None,
            wanted=VARIANTS) -> tuple[dict, dict]:
    """Export the float32 and the Keras mixed_bfloat16 SavedModels (same weights) and convert the float32 one into
    the `wanted` variants (the in-place lists and --freeze conversions always: their facts head the page).

    Returns:
        ({variant: SavedModel path}, conversion facts for this model).
    """
    import keras

    from mp_rewrite.savedmodel.convert import convert_saved_model
    paths = {"fp32": workdir / name / "fp32", "ours_lists": workdir / name / "ours_bf16",
             "keras_mixed": workdir / name / "keras_mixed_bf16", "ours_mm": workdir / name / "ours_mm_bf16",
             "ours_freeze": workdir / name / "ours_freeze_bf16", "ours_tuned": workdir / name / "ours_tuned",
             "ours_split": workdir / name / "ours_freeze_split2_bf16",
             "ours_split_auto": workdir / name / "ours_freeze_split_auto_bf16",
             "ours_lists_split": workdir / name / "ours_split2_bf16"}
    paths["tf_amp"] = paths["fp32"]
    if openvino_python:
        paths["openvino"] = paths["fp32"]  # OpenVINO converts the float32 SavedModel itself, in its worker
    mixed_wanted = "keras_mixed" in wanted and not (paths["keras_mixed"] / "saved_model.pb").exists()
    if not (paths["fp32"] / "saved_model.pb").exists() or mixed_wanted:
        model = with_statistics(build_model(name))
        if name in RANDOM_BIASES:
            model = with_random_biases(model)
        export(name, model, paths["fp32"])
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            mixed = build_model(name)
            mixed.set_weights(model.get_weights())
            export(name, mixed, paths["keras_mixed"])
        finally:
            keras.mixed_precision.set_global_policy("float32")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        result = convert_saved_model(paths["fp32"], paths["ours_lists"], "bfloat16", overwrite=True)
        times.append(time.perf_counter() - start)
    freeze_times = []
    for _ in range(3):
        start = time.perf_counter()
        convert_saved_model(paths["fp32"], paths["ours_freeze"], "bfloat16", freeze=True, overwrite=True)
        freeze_times.append(time.perf_counter() - start)
    if "ours_split" in wanted:  # --freeze --split 2: the batch in two concurrent branches (serve with 1 thread)
        convert_saved_model(paths["fp32"], paths["ours_split"], "bfloat16", freeze=True, split=2, overwrite=True)
    split_auto = ""
    if "ours_split_auto" in wanted:  # --freeze --split auto: what the race in both serving settings kept
        auto = convert_saved_model(paths["fp32"], paths["ours_split_auto"], "bfloat16", freeze=True, split="auto",
                                   overwrite=True)
        split_auto = next((note for note in auto.notes if note.startswith("signature")), "")
    if "ours_lists_split" in wanted:  # in place, --split 2: the signatures call their bodies per slice
        convert_saved_model(paths["fp32"], paths["ours_lists_split"], "bfloat16", split=2, overwrite=True)
    predictions, default_seconds, cost_seconds, tune_seconds, chosen = {}, None, None, None, "-"
    if {"ours", "ours_cost"} & set(wanted):
        cost_paths, predictions, default_seconds, cost_seconds = convert_by_cost(paths["fp32"], workdir / name,
                                                                                 TUNE_BATCH)
        paths.update(cost_paths)
    any_seconds = None
    if "ours_any" in wanted:  # `convert` without --batch-size: converted once, the best across batch 1, 8 and 32
        paths["ours_any"] = workdir / name / "ours_default_any"
        predictions_any, any_seconds = convert_default(paths["fp32"], paths["ours_any"])
    if "ours_tuned" in wanted:
        from mp_rewrite.savedmodel.tune import tune_saved_model
        # Tuned at the first serving batch size measured (the tuner times on this machine, at this batch).
        start = time.perf_counter()
        chosen = tune_saved_model(paths["fp32"], paths["ours_tuned"], "bfloat16", freeze=True, overwrite=True,
                                  rounds=3, batch_size=TUNE_BATCH).chosen
        tune_seconds = time.perf_counter() - start
    if "ours_mm" in wanted:
        lists = workdir / "matmul_conv_only.toml"
        lists.write_text(MATMUL_CONV_ONLY)
        convert_saved_model(paths["fp32"], paths["ours_mm"], "bfloat16", lists_file=str(lists), overwrite=True)
    inc = {}
    if inc_python:
        paths["inc"] = workdir / name / "inc_bf16"
        inc = inc_convert(inc_python, paths["fp32"], paths["inc"], workdir)
    facts = {"convert_s": statistics.median(times), "freeze_s": statistics.median(freeze_times),
             "cost_s": cost_seconds, "tune_s": tune_seconds, "default_s": default_seconds, "any_s": any_seconds,
             "predicted": {TUNE_BATCH: predictions, **({"any": predictions_any} if any_seconds else {})},
             "inc_s": inc.get("seconds"),
             "tuned": chosen, "split_auto": split_auto,
             "freeze_mb": sum(f.stat().st_size for f in paths["ours_freeze"].rglob("*") if f.is_file()) / 1e6,
             "flop_share": result.flops.share,
             "converted": result.converted_nodes, "casts": result.casts,
             "size_mb": sum(f.stat().st_size for f in paths["fp32"].rglob("*") if f.is_file()) / 1e6}
    return {v: path for v, path in paths.items() if v in wanted or v in PEERS}, facts


def convert_default(source: Path, output: Path) -> tuple[dict, float]:
    """The default conversion for a CPU as `convert SRC OUT --precision bfloat16` makes it, no --batch-size (the
    variants raced at batch 1, 8 and 32). Returns ({"ours_any": what it predicted}, its seconds)."""
    from mp_rewrite.analysis.op_costs import this_machine
    from mp_rewrite.commands.list_options import predicted
    from mp_rewrite.savedmodel.convert import convert_saved_model
    start = time.perf_counter()
    result = convert_saved_model(source, output, "bfloat16", assign="cost", costs=this_machine("bfloat16"),
                                 overwrite=True)
    return {"ours_any": predicted(next(iter(result.graphs.values())))}, time.perf_counter() - start


def convert_by_cost(source: Path, workdir: Path, batch: int) -> tuple[dict, dict, float, float]:
    """The two cost-assignment variants measured at `batch`, as `convert --batch-size` measures them: the default
    conversion for a CPU (in place) and --freeze. Returns (their paths, what each predicted, and their seconds)."""
    from mp_rewrite.analysis.op_costs import this_machine
    from mp_rewrite.commands.list_options import predicted
    from mp_rewrite.savedmodel.convert import convert_saved_model
    paths = {"ours": workdir / f"ours_default_b{batch}", "ours_cost": workdir / f"ours_cost_b{batch}"}
    predictions, seconds = {}, {}
    for variant, freeze in (("ours", False), ("ours_cost", True)):
        costs = this_machine("bfloat16")
        costs.batch = batch
        start = time.perf_counter()
        result = convert_saved_model(source, paths[variant], "bfloat16", assign="cost", costs=costs, freeze=freeze,
                                     overwrite=True)
        seconds[variant] = time.perf_counter() - start
        predictions[variant] = predicted(next(iter(result.graphs.values())))
    return paths, predictions, seconds["ours"], seconds["ours_cost"]


def inc_convert(python: str, source: Path, output: Path, workdir: Path) -> dict:
    """Intel Neural Compressor's bfloat16 conversion, run in its own environment (tools/inc_convert.py)."""
    import shutil
    shutil.rmtree(output, ignore_errors=True)
    done = subprocess.run([python, str(ROOT / "tools" / "inc_convert.py"), str(source), str(output)], cwd=workdir,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"Intel Neural Compressor failed on {source}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_convert_seconds(source: Path, output: Path, *options: str) -> float:
    """Wall time of `mp-rewrite convert SOURCE OUTPUT --precision bfloat16 --overwrite [OPTIONS]` (TF start-up
    included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mp_rewrite", "convert", str(source), str(output), "--precision",
                    "bfloat16", "--overwrite", *options], check=True, capture_output=True)
    return time.perf_counter() - start
