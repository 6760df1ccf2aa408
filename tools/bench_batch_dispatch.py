"""Benchmark: the batch dispatch of `convert --freeze` (issue 39, item 2) on the benchmark's models.

    python tools/bench_batch_dispatch.py [transformer mobilenetv2 mobilenetv2_96] [--repeat 2] [--force]
        [--in-place] [--workdir DIR] [--json FILE]

Each model is built and exported once (tools/bench_models.py: random weights with trained-like statistics;
mobilenetv2_96 is the README's `keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3))` until
d6bbff9, efficientnet_96 its EfficientNetB0 (96x96, BatchNorms calibrated on one random batch) since), then
converted `--precision bfloat16 --freeze` with the CPU default (the cost assignment measured on this machine, no
--batch-size: raced at batch 1, 8 and 32), each conversion in a fresh process with a fresh profile cache
(XDG_CACHE_HOME), `--repeat` times, models alternated. Each line prints what the conversion said first (the race's
decision, or the dispatch's), float32 and bfloat16 alone at each batch as the dispatch timed them (ms per call,
interleaved rounds), and where the dispatch was built, its times beside them and the verdict. `--force` sets
MP_REWRITE_DISPATCH=force: the dispatch (float32 below batch 8, bfloat16 from 8) is built and timed whatever the
variants alone showed -- what the mechanism costs where the winner does not change. `--in-place` converts without
--freeze (the dispatch in place: savedmodel/dispatch_in_place.py). CPU flags and the load average (before and after
each conversion) are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
MODELS = ("transformer", "mobilenetv2", "mobilenetv2_96", "efficientnet_96")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--in-place", action="store_true", help="convert in place (no --freeze)")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "mp_rewrite_bench_dispatch"))
    parser.add_argument("--json", help="append each conversion's record to this file (JSON lines)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = Path(args.workdir)
    if args.child:
        print(json.dumps(_converted(args.child, work, not args.in_place)))
        return 0
    from bench_saved_model_report import machine
    facts = machine()
    print(f"Machine: {facts['cpu']}, {facts['cores']} cores, {', '.join(facts['features']) or 'no bfloat16 units'}; "
          f"TensorFlow {facts['tensorflow']}, Keras {facts['keras']}; {_load()}", flush=True)
    for name in args.models:
        _exported(name, work)
    for run in range(1, args.repeat + 1):
        for name in args.models:
            before = _load()
            record = _child(name, work, args.force, args.in_place)
            record.update(run=run, load_before=before, load_after=_load(), force=args.force,
                          strategy="in place" if args.in_place else "--freeze")
            _print(record)
            if args.json:
                with open(args.json, "a") as out:
                    out.write(json.dumps(record) + "\n")
    return 0


def _load() -> str:
    return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])


def _exported(name: str, work: Path) -> Path:
    """The float32 SavedModel of `name` under `work` (built once)."""
    path = work / name / "fp32"
    if (path / "saved_model.pb").exists():
        return path
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    from bench_models import build_model, export, with_statistics
    if name == "mobilenetv2_96":  # the README's model until d6bbff9, as it was built there
        keras.utils.set_random_seed(0)
        model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3))
        model.export(str(path), verbose=False)
    elif name == "efficientnet_96":  # the README's model since d6bbff9, as the README builds it
        import numpy as np
        keras.utils.set_random_seed(1)
        model = keras.applications.EfficientNetB0(weights=None, input_shape=(96, 96, 3), classifier_activation=None)
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = 0.0
        model(np.random.randn(16, 96, 96, 3), training=True)
        model.export(str(path), verbose=False)
    else:
        export(name, with_statistics(build_model(name)), path)
    return path


def _child(name: str, work: Path, force: bool, in_place: bool = False) -> dict:
    """One conversion in a fresh process, with a fresh profile cache."""
    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="mp_rewrite_cache_"),
               PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="1")
    env.pop("MP_REWRITE_ASSIGN", None)
    if force:
        env["MP_REWRITE_DISPATCH"] = "force"
    done = subprocess.run([sys.executable, __file__, "--child", name, "--workdir", str(work),
                           *(["--in-place"] if in_place else [])], env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"converting {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _converted(name: str, work: Path, freeze: bool = True) -> dict:
    """Convert `name` --precision bfloat16 (--freeze) with the CPU default; what it said and measured."""
    from mp_rewrite.analysis.op_costs import this_machine
    from mp_rewrite.commands.list_options import predicted
    from mp_rewrite.savedmodel.convert import convert_saved_model
    output = work / name / "dispatch_out"
    start = time.perf_counter()
    result = convert_saved_model(work / name / "fp32", output, "bfloat16", assign="cost",
                                 costs=this_machine("bfloat16"), freeze=freeze, overwrite=True)
    seconds = time.perf_counter() - start
    graph = next(iter(result.graphs.values()))
    choice = getattr(graph, "dispatch", None)
    said = (predicted(graph) or {}).get("decision", "")
    record = {"model": name, "seconds": seconds, "decision": said, "converted": result.converted_nodes,
              "mb": sum(f.stat().st_size for f in output.rglob("*") if f.is_file()) / 1e6,
              "dispatch": None}
    if choice is not None:
        record["dispatch"] = {"kept": choice.kept, "why": choice.why, "segments": [list(s) for s in choice.segments],
                              "alone": _medians(choice.alone), "times": _medians(choice.times),
                              "ratios": _ratios(choice.times)}
    return record


def _medians(times: dict) -> dict:
    return {str(b): [round(m, 3) for m in t.medians] for b, t in times.items()}


def _ratios(times: dict) -> dict:
    """{batch: the dispatch's paired ratio over float32's and over bfloat16's, as text}."""
    return {str(b): [t.ratio(2, 0).text(), t.ratio(2, 1).text()] for b, t in times.items()}


def _print(record: dict) -> None:
    choice = record["dispatch"]
    print(f"\n{record['model']} ({record['strategy']}, run {record['run']}{', forced' if record['force'] else ''}; "
          f"{record['load_before']} -> {record['load_after'].removeprefix('load average ')}): "
          f"{record['converted']} nodes bfloat16, {record['mb']:.1f} MB, {record['seconds']:.1f} s", flush=True)
    print(f"  first line: {record['decision'] or '(none)'}")
    if choice is None:
        print("  dispatch: not tried")
        return
    alone = choice["alone"]
    print("  alone (float32 / bfloat16 ms per call): " +
          "; ".join(f"batch {b}: {f:.2f} / {low:.2f}" for b, (f, low) in alone.items()))
    if choice["times"]:
        print("  raced (float32 / bfloat16 / dispatch ms): " +
              "; ".join(f"batch {b}: {' / '.join(f'{x:.2f}' for x in t)}" for b, t in choice["times"].items()))
        print("  dispatch over float32, over bfloat16: " +
              "; ".join(f"batch {b}: {r[0]}, {r[1]}" for b, r in choice["ratios"].items()))
    print(f"  dispatch: {'kept' if choice['kept'] else 'not kept'}: {choice['why']}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
