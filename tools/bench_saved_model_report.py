"""The page and chart of tools/bench_saved_model.py: tables of latency and speed-up per variant, conversion facts."""

from __future__ import annotations

import os
import platform
from pathlib import Path

LABELS = {"fp32": "float32", "ours": "mp-rewrite default (cost)",
          "ours_any": "mp-rewrite default, no --batch-size", "ours_lists": "mp-rewrite bf16 --assign lists",
          "ours_freeze": "mp-rewrite --freeze --assign lists",
          "ours_cost": "mp-rewrite --freeze --assign cost",
          "ours_tuned": "mp-rewrite --freeze --tune",
          "tf_amp": "TF AMP (oneDNN bf16)", "keras_mixed": "Keras mixed_bfloat16",
          "ours_mm": "mp-rewrite bf16, matmul/conv only", "inc": "Intel Neural Compressor bf16",
          "openvino": "OpenVINO (CPU plugin)", "ours_split": "mp-rewrite --freeze --split 2",
          "ours_split_auto": "mp-rewrite --freeze --split auto",
          "ours_lists_split": "mp-rewrite bf16 --assign lists --split 2 (in place)"}
# The TF variants timed again in a serving setting (bench_saved_model.py --serving), after every default one.
LABELS.update({f"{v}@intra1": f"{label}, 1 intra-op thread" for v, label in list(LABELS.items()) if v != "openvino"})


def variants(row: dict) -> list:
    """The variants measured in a row, in the order of LABELS."""
    return [v for v in LABELS if v in row["ms"]]


NOTES = """Notes:

- "TF executes the same nodes" compares the census (op, dtype -> count) of the graphs TensorFlow ran for the
  mp-rewrite model and for TF's own rewrite of the float32 model (the kernels a profiler trace of one call shows, of
  the graphs in eager run metadata: analysis.execution.ran_nodes). Where it says yes, the two
  run the same kernels and any difference between their columns is measurement noise.
- Keras 3 lowers BatchNormalization to Mul/AddV2 (not FusedBatchNormV3, which oneDNN would fuse into the
  convolution). Grappler's bfloat16 lists put those ops (infer list) and Relu6 (clear list) in bfloat16 between
  convolutions, and TensorFlow runs bfloat16 elementwise ops through Eigen, which on this CPU is slower than
  float32 (a [8,56,56,144] Mul+Add: 2.9 ms float32, 4.4 ms bfloat16; Relu6 1.8 vs 3.5 ms; a depthwise conv 3.5 vs
  2.0 ms). Models dominated by BatchNorm + activation (MobileNetV2) are therefore slower in bfloat16 with every
  variant that follows Grappler's lists.
- "matmul/conv only" is not Grappler's lists: the same conversion with a `--lists` file that empties the infer and
  clear lists (`[infer] ops = []`, `[clear] ops = []`), so only MatMul/Conv/Einsum run in bfloat16 with casts
  around them.
- With random weights MobileNetV2's softmax output is uniform, so its output differences say little."""


SAME = {True: "yes", False: "no", None: "-"}  # "-": TF AMP or the lists variant not measured


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def machine() -> dict:
    """Facts about this machine and the software."""
    import keras
    import tensorflow as tf
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    flags = open("/proc/cpuinfo").read()
    features = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f in flags]
    return {"cpu": cpu, "cores": os.cpu_count(), "features": features, "tensorflow": tf.__version__,
            "keras": keras.__version__, "python": platform.python_version()}


def table(rows: list[dict], key: str = "ms") -> list[str]:
    """Markdown table: median ms per variant (wall latency, or CPU time with key="cpu_ms"), then every variant's
    speed-up over float32 (float32 ms / its ms; > 1 is faster than float32)."""
    measured = [v for v in LABELS if any(v in row[key] for row in rows)]  # a row may lack one: "-"
    others = [v for v in measured if v != "fp32"]
    head = ("| model | batch | " + " | ".join(f"{LABELS[v]} ms" for v in measured) + " | " +
            " | ".join(f"{LABELS[v]} vs float32" for v in others) + " | TF runs the same nodes for ours (lists) and TF AMP |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        ms = row[key]
        lines.append(f"| {row['model']} | {row['batch']} | " +
                     " | ".join(f"{ms[v]:.1f}" if v in ms else "-" for v in measured) + " | " +
                     " | ".join(f"{ms['fp32'] / ms[v]:.2f}x" if v in ms else "-" for v in others) +
                     f" | {SAME[row['same_graph_as_tf_amp']]} |")
    return lines


def chart(rows: list[dict], path: Path) -> str:
    """A grouped bar chart of speed-up over float32 per model and batch; returns a note for the report."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    measured = variants(rows[0])
    # Wide enough for every bar's label, and one distinct color per variant (the default cycle repeats after 10).
    # Wide enough for every bar's label and every group's name ("transformer / batch 32" needs about 1.4 inches).
    fig, axes = plt.subplots(2, 1, figsize=(max(11, 0.16 * len(rows) * len(measured), 1.4 * len(rows)), 9),
                             sharex=True)
    colors = plt.get_cmap("tab20").colors
    width = 0.8 / len(measured)
    for ax, key, what in zip(axes, ("ms", "cpu_ms"), ("wall-clock latency", "CPU time per call")):
        for i, v in enumerate(measured):
            speedups = [row[key]["fp32"] / row[key][v] for row in rows]
            offset = (i - (len(measured) - 1) / 2) * width
            bars = ax.bar([x + offset for x in range(len(rows))], speedups, width, label=LABELS[v],
                          color=colors[2 * i % 20 + (2 * i // 20)])
            ax.bar_label(bars, fmt="%.2f", fontsize=5, rotation=90, padding=2)
        ax.set_ylabel("speed-up over float32")
        ax.set_ylim(0, 1.55 * max(row[key]["fp32"] / row[key][v] for row in rows for v in measured))
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_title(f"SavedModel inference, bfloat16 variants vs float32: {what} (median; higher is better)",
                     fontsize=10)
    # Below both charts, in the figure: the variants' names are long, and a legend inside the axes spilled past
    # the figure's edge (the last name cut off) and squeezed the charts.
    columns = 3
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, ncol=columns, loc="lower center")
    axes[1].set_xticks(range(len(rows)), [f"{r['model']}\nbatch {r['batch']}" for r in rows])
    fig.tight_layout(rect=(0, 0.025 * -(-len(measured) // columns), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return f"chart: {path}"


KERNEL_ROWS = 12


def kernel_tables(rows: list[dict]) -> list[str]:
    """Per model and batch, where the time of a call goes: the kernels TF ran for each profiled variant (summed
    per kind, from a Session's step stats) beside OpenVINO's per-layer profile (PERF_COUNT), slowest first."""
    lines = []
    for row in rows:
        profiled = [v for v in variants(row) if v in row.get("kernel_ms", {})]
        if not profiled:
            continue
        lines += ["", f"Where the time of one call goes, {row['model']} batch {row['batch']} (ms per call, the "
                  f"{KERNEL_ROWS} slowest kinds of kernel; the total is every kernel's time, which exceeds the wall "
                  "time where kernels ran side by side):", "",
                  "| " + " | ".join(f"{LABELS[v]} | ms" for v in profiled) + " |",
                  "|" + "---|---|" * len(profiled)]
        tables = [list(row["kernel_ms"][v].items()) for v in profiled]
        for i in range(KERNEL_ROWS):
            cells = [f"{t[i][0]} | {t[i][1]:.2f}" if i < len(t) else " | " for t in tables]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("| " + " | ".join(f"**total** | **{sum(ms for _, ms in t):.2f}**" for t in tables) + " |")
    return lines


DISTURBED = 0.25  # cores other processes may use while a variant's blocks run (median) before its times are marked


def disturbed(rows: list[dict]) -> str:
    """The page's line on what other processes used while each variant was timed (the median over its blocks of
    /proc/stat's busy time less the worker's CPU time, in cores: mp_rewrite.analysis.machine_load), naming every
    time above DISTURBED: a wall time another process shared its cores with, to be read with care."""
    found = [(row["model"], row["batch"], LABELS.get(v, v), x)
             for row in rows for v, x in row.get("others", {}).items()]
    if not found:
        return "What other processes used while each variant was timed: not known here (no /proc/stat)."
    marked = [f"{model} batch {batch} {label}: {x:.2f} cores" for model, batch, label, x in found if x > DISTURBED]
    most = max(x for *_, x in found)
    if not marked:
        return (f"Other processes used at most {most:.2f} cores while any variant was timed (median over its blocks, "
                "from /proc/stat): no time above was disturbed.")
    return (f"Disturbed: other processes used more than {DISTURBED} cores (median over the blocks, from /proc/stat) "
            f"while these were timed, so their times above were shared with another process: {'; '.join(marked)}.")


def report(rows, facts, cli_seconds, info, load, command, note) -> str:
    """The markdown page."""
    lines = ["# SavedModel conversion benchmark", "", f"Command: `{command}`", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, {', '.join(info['features']) or 'no bf16 ISA'}; "
             f"TensorFlow {info['tensorflow']}, Keras {info['keras']}, Python {info['python']}. "
             f"Load average before/after: {load[0]:.2f} / {load[1]:.2f} (a shared machine: the interleaved "
             "blocks keep the comparison fair, absolute numbers vary).", "",
             "Median wall-clock latency of one `serving_default` call (ms), and each variant's speed-up over float32 "
             "(> 1 is faster than float32):", ""] + table(rows)
    lines += ["", disturbed(rows)]
    lines += ["", "Median CPU time of one call (ms, all threads of the worker process; less sensitive to other "
              "processes on a shared machine):", ""] + table(rows, "cpu_ms")
    lines += ["", "Conversion (`convert_saved_model`, bfloat16, in-process median of 3; CLI wall time includes "
              "starting TensorFlow):", "", "| model | SavedModel MB | --freeze MB | convert s | --freeze s | CLI s "
              "(--freeze) | --assign cost s | default, no --batch-size s | --tune s | INC s | --tune chose | nodes "
              "converted | casts | matmul/conv FLOPs in bf16 |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in facts.items():
        cli = "{:.1f} ({:.1f})".format(*cli_seconds[name]) if name in cli_seconds else "-"
        lines.append(f"| {name} | {f['size_mb']:.0f} | {f['freeze_mb']:.0f} | {f['convert_s']:.2f} | "
                     f"{f['freeze_s']:.2f} | {cli} | {_seconds(f.get('cost_s'))} | {_seconds(f.get('any_s'))} | "
                     f"{_seconds(f.get('tune_s'))} | "
                     f"{_seconds(f['inc_s'])} | "
                     f"{f['tuned']} | {f['converted']} | {f['casts']} | "
                     f"{f['flop_share']:.1%} |")
    said = [(name, f["split_auto"]) for name, f in facts.items() if f.get("split_auto")]
    if said:
        lines += ["", "What `--freeze --split auto` kept, as its convert line says (timed in the benchmark's process, "
                  "TF's default threads, and in a child process with one intra-op thread):", ""]
        lines += [f"- {name}: {line}" for name, line in said]
    lines += ["", "What the cost assignment predicted at conversion (converted at the batch it is timed at, as "
              "`--batch-size` does, or once without it: batch \"any\"; ms per run of the candidate ops, from the costs it measured in the model: "
              "float32, Grappler's lists, the cut, and the bound -- each op at its faster precision, casts not "
              "counted):", "",
              "| model | batch | variant | float32 | lists | cut | bound | cut over bound | kept float32 | where the "
              "costs come from |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in facts.items():
        for batch, p, v in [(b, p, v) for b, ps in f.get("predicted", {}).items() for v, p in ps.items()]:
            if p:
                lines.append(f"| {name} | {batch} | {LABELS[v]} | {p['fp32_cost']:.2f} | {p['lists_cost']:.2f} | "
                             f"{p['cost']:.2f} | {p['bound']:.2f} | {p['cost'] / max(p['bound'], 1e-9) - 1:+.1%} | "
                             f"{p['demoted']} of {p['candidates']} | {p['note'] or p['source']} |")
    lines += ["", "Cast nodes TensorFlow executed per call (traced; a frozen conversion has folded the weight casts; "
              "a routed model counts the side it ran):", ""]
    for row in rows:
        lines.append(f"- {row['model']} batch {row['batch']}: " +
                     ", ".join(f"{LABELS[v]} {row['casts'][v]}" for v in variants(row)))
    lines += ["", "Matmul/convolution kernels TensorFlow executed in bfloat16, of all it executed (traced; "
              "OpenVINO and INC's own graph say nothing here):", ""]
    for row in rows:
        lines.append(f"- {row['model']} batch {row['batch']}: " +
                     ", ".join(f"{LABELS[v]} {low}/{total}" for v in variants(row)
                               for low, total in [row["kernels"][v]]))
    lines += ["", "Max |output - float32 output| per variant (TF AMP must differ from float32, or its rewrite did "
              "not take effect):", ""]
    for row in rows:
        lines.append(f"- {row['model']} batch {row['batch']}: " +
                     ", ".join(f"{LABELS[v]} {row['diff_vs_fp32'][v]:.2e}" for v in variants(row)[1:]))
    lines += kernel_tables(rows)
    openvino = [row for row in rows if row.get("openvino")]
    if openvino:
        info = openvino[0]["openvino"]
        lines += ["", f"OpenVINO {info['openvino']}: `openvino.convert_model` of the float32 SavedModel, reshaped to "
                  f"the fed shapes, CPU plugin, {info['threads']} threads, performance hint {info['hint']}, inference "
                  f"precision {info['precision']} (its default on this CPU); OpenVINO runs its own kernels, so its "
                  "Cast count says nothing. Conversion + compilation s:", ""]
        lines += [f"- {row['model']} batch {row['batch']}: {row['openvino']['convert_s']:.1f} + "
                  f"{row['openvino']['compile_s']:.1f}" for row in openvino]
    return "\n".join(lines + ["", NOTES, "", note, ""])


