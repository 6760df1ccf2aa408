"""Measured op costs of a machine: what the cost assignment (core.assignment) consumes, measured here or loaded.

A `MachineCosts` holds, for one machine and one low precision, the time of each distinct op signature -- (op, input
shapes, attributes, which type attributes the lists make low) -- in float32 and in low precision, and the time of a
Cast per tensor size. `measure_costs(graph_def)` times the signatures of a graph's candidates that the machine's
cache does not hold yet (analysis.op_timing); `MachineCosts.for_graph(graph_def)` turns it into the per-node
core.assignment.CostTable of one graph (analysis.graph_costs).

Cache: one JSON file per machine (CPU model and flags, TensorFlow version, oneDNN settings: TF_ENABLE_ONEDNN_OPTS
and ONEDNN_MAX_CPU_ISA, thread count) and precision under `$XDG_CACHE_HOME/mp_rewrite/` (default
`~/.cache/mp_rewrite/`). `save(path)`/`load_costs(path)` export and import the same format, so a model can be
converted on one machine for another: measure where you serve.

Defaults (documented fallbacks): an op that cannot be measured (unknown shape, no kernel, a non-constant integer
input) costs the same in both precisions, so the casts around it decide; a tensor of unknown size costs
core.assignment.DEFAULT_CAST_MS per cast. On a machine without low-precision units (no AVX512-BF16/AMX for
bfloat16) nothing is measured and every candidate stays float32, with a note saying why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform

from ..errors import CostTableError

FORMAT = "mp_rewrite-costs"
VERSION = 1
NATIVE_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
MACHINE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")


ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN reads either name
# oneDNN's ISA levels as the bit masks of its dnnl_cpu_isa_t: a cap allows the levels whose bits it holds. Its low
# precision kernels need a level with the instructions (bfloat16: AVX512_CORE_BF16; float16: AVX512_CORE_FP16, which
# oneDNN 3.3 renamed AVX10_1_512); AVX2_VNNI_2 only converts. A name not here (a newer level, ALL) caps nothing we
# know of.
ONEDNN_ISA_MASKS = {"SSE41": 0x1, "AVX": 0x3, "AVX2": 0x7, "AVX2_VNNI": 0xf, "AVX2_VNNI_2": 0x1f,
                    "AVX512_CORE": 0x27, "AVX512_CORE_VNNI": 0x67, "AVX512_CORE_BF16": 0xe7,
                    "AVX512_CORE_FP16": 0x1ef, "AVX10_1_512": 0x1ef, "AVX512_CORE_AMX": 0xfef,
                    "AVX10_1_512_AMX": 0xfef, "AVX512_CORE_AMX_FP16": 0x1fef, "AVX10_1_512_AMX_FP16": 0x1fef}
NATIVE_ISA = {"bfloat16": "AVX512_CORE_BF16", "float16": "AVX512_CORE_FP16"}


def isa_cap_allows(precision: str, cap: str) -> bool:
    """Whether oneDNN held to `cap` (ONEDNN_MAX_CPU_ISA's value, "default" when unset) may use the instructions that
    compute `precision` natively: False under AVX2 or AVX512_CORE for bfloat16 (no bfloat16 kernels then, not even
    on a CPU that has the units), True for no cap or one this table does not know."""
    need = ONEDNN_ISA_MASKS.get(NATIVE_ISA.get(precision, ""))
    held = ONEDNN_ISA_MASKS.get(str(cap).strip().upper())
    return need is None or held is None or held & need == need


def onednn_settings() -> dict:
    """The environment oneDNN's kernels depend on: TensorFlow's switch (TF_ENABLE_ONEDNN_OPTS) and oneDNN's ISA cap
    (ONEDNN_MAX_CPU_ISA, or its older name DNNL_MAX_CPU_ISA). Held to AVX2, an AVX512-BF16 CPU has no bfloat16
    kernels and other float32 ones: times measured with the full ISA do not hold there, nor the other way round."""
    isa = next((os.environ[name] for name in ISA_VARIABLES if os.environ.get(name)), "default")
    return {"onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
            "onednn_max_cpu_isa": isa.strip().upper() if isa != "default" else isa}


def machine_facts() -> dict:
    """What the measured times depend on: CPU model and flags, TensorFlow version, oneDNN settings
    (onednn_settings), threads."""
    import tensorflow as tf
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {"cpu": model, "cpu_flags": sorted(flags & set(MACHINE_FLAGS)), "tensorflow": tf.__version__,
            **onednn_settings(), "threads": os.cpu_count()}


def cache_dir() -> str:
    """`$XDG_CACHE_HOME/mp_rewrite`, or `~/.cache/mp_rewrite`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mp_rewrite")


@dataclasses.dataclass
class MachineCosts:
    """Measured costs of one machine for one low precision.

    Attributes:
        precision: "bfloat16" or "float16".
        machine: machine_facts() of where it was measured.
        ops: op signature key -> [float32 ms, low ms], or None when the op could not be measured.
        casts: [(elements, ms to low, ms to float32)] by size.
        source: where the table came from (a file, the cache, "measured").
        batch: the batch size an unknown leading input dimension was measured at (None: 1); for_graph's default.
        dim: the size a model measured in place or frozen gets for its inputs' other unknown dimensions (a
            sequence's length; convert's --seq-len), None for the made-up inputs' default.
    """

    precision: str
    machine: dict
    ops: dict = dataclasses.field(default_factory=dict)
    casts: list = dataclasses.field(default_factory=list)
    source: str = "measured"
    batch: int | None = None
    dim: int | None = None
    measure: bool = False  # for_graph measures (and caches) what the table lacks first: the training hook's mode

    @property
    def low_units(self) -> bool:
        """Whether the measured machine computes the precision natively: its CPU has the instructions, and oneDNN
        was not held below them (ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-BF16 CPU: no bfloat16 kernels)."""
        return self._cpu_units() and isa_cap_allows(self.precision, self.machine.get("onednn_max_cpu_isa", "default"))

    def _cpu_units(self) -> bool:
        return bool(set(NATIVE_FLAGS.get(self.precision, ())) & set(self.machine.get("cpu_flags", ())))

    def no_units_note(self) -> str:
        """The one line saying why everything stays float32 ("" when the machine has the units)."""
        if self.low_units:
            return ""
        if self._cpu_units():
            cap = self.machine.get("onednn_max_cpu_isa")
            return (f"oneDNN is held to {cap} (ONEDNN_MAX_CPU_ISA) on the machine the costs are for: no "
                    f"{self.precision} kernels below {NATIVE_ISA[self.precision]}, so every op stays float32 (unset "
                    f"it, or set it to {NATIVE_ISA[self.precision]} or above, to compute in {self.precision})")
        flags = " or ".join(NATIVE_FLAGS.get(self.precision, ()))
        return (f"the CPU the costs are for ({self.machine.get('cpu', '?')}) has no {flags}: {self.precision} is "
                "slower than float32 there, so every op stays float32")

    def cast_ms(self, elements: int | None) -> tuple:
        """(ms to low, ms to float32) of one Cast of `elements` elements, interpolated log-log between sizes."""
        from ..core.assignment import DEFAULT_CAST_MS
        if elements is None or not self.casts:
            return DEFAULT_CAST_MS, DEFAULT_CAST_MS
        points = sorted(self.casts)
        if elements <= points[0][0]:
            return tuple(points[0][1:])
        lo, hi = points[-2:] if elements >= points[-1][0] else next(
            (a, b) for a, b in zip(points, points[1:]) if a[0] <= elements <= b[0])
        w = (math.log(elements) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0]))
        return tuple(max(0.0, a + w * (b - a)) if a > 0 and b > 0 else max(a, b) for a, b in zip(lo[1:], hi[1:]))

    def for_graph(self, graph_def, precision: str | None = None, fetches=(), batch: int | None = None):
        """The core.assignment.CostTable of one graph (and the library functions it reaches).

        Raises:
            CostTableError: the table is for another precision, or holds none of the graph's op signatures.
        """
        from .graph_costs import cost_table
        if precision is not None and precision != self.precision:
            raise CostTableError(f"the cost table ({self.source}) was measured for {self.precision}, not "
                                 f"{precision}; measure it with: mp-rewrite costs MODEL --precision {precision}")
        batch = self.batch if batch is None else batch
        if self.measure and self.low_units:
            from .graph_costs import measure_missing
            if measure_missing(self, graph_def, fetches, batch):
                self.save_to_cache()
        return cost_table(self, graph_def, fetches, batch)

    def save_to_cache(self) -> None:
        os.makedirs(cache_dir(), exist_ok=True)
        saved = (self.source, self.batch)
        self.source, self.batch = "measured", None  # the cache holds every batch size's signatures
        try:
            self.save(cache_path(self.precision, self.machine))
        finally:
            self.source, self.batch = saved

    def to_json(self) -> str:
        """The table as JSON text (the format load_costs reads)."""
        return json.dumps({"format": FORMAT, "version": VERSION, "precision": self.precision,
                           "machine": self.machine, "batch": self.batch, "casts": self.casts,
                           "ops": dict(sorted(self.ops.items()))},
                          indent=1)

    def save(self, path: str) -> None:
        """Write the table to `path` atomically (a temporary file renamed over it)."""
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.to_json())
            os.replace(tmp, path)
        except OSError as e:
            raise CostTableError(f"cannot write the cost table '{path}': {e.strerror or e}") from None


def load_costs(path: str, check_version: bool = True) -> MachineCosts:
    """Read a cost table file written by MachineCosts.save (`mp-rewrite costs MODEL -o FILE`).

    Raises:
        CostTableError: a missing or malformed file, or one measured with another TensorFlow version.
    """
    fix = "write it again with: mp-rewrite costs MODEL -o FILE"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise CostTableError(f"cannot read the cost table '{path}': {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CostTableError(f"the cost table '{path}' is not JSON ({e}); {fix}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise CostTableError(f"'{path}' is not a cost table of this mp_rewrite (format {FORMAT!r} version "
                             f"{VERSION}); {fix}")
    table = _parse(data, path, fix)
    if check_version:
        import tensorflow as tf
        if table.machine.get("tensorflow") != tf.__version__:
            raise CostTableError(f"the cost table '{path}' was measured with TensorFlow "
                                 f"{table.machine.get('tensorflow')}, this is {tf.__version__}; its kernels differ, "
                                 "so measure again where the model is served")
    return table


def _parse(data: dict, path: str, fix: str) -> MachineCosts:
    precision, machine, ops, casts = (data.get(k) for k in ("precision", "machine", "ops", "casts"))
    ok = (precision in NATIVE_FLAGS and isinstance(machine, dict) and isinstance(ops, dict)
          and isinstance(casts, list))
    ok = ok and all(v is None or (isinstance(v, list) and len(v) == 2 and all(_time(x) for x in v))
                    for v in ops.values())
    ok = ok and all(isinstance(c, list) and len(c) == 3 and all(_time(x) for x in c) for c in casts)
    if not ok:
        raise CostTableError(f"the cost table '{path}' is malformed (precision, machine, ops or casts); {fix}")
    batch = data.get("batch")
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise CostTableError(f"the cost table '{path}' has batch {batch!r}, not a positive integer; {fix}")
    return MachineCosts(precision, machine, ops, [tuple(c) for c in casts], source=path, batch=batch)


def _time(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 and math.isfinite(x)


def cache_path(precision: str, machine: dict) -> str:
    """The cache file of this machine and precision."""
    digest = hashlib.sha1(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache_dir(), f"costs-{precision}-{digest}.json")


def cached_costs(precision: str) -> MachineCosts:
    """This machine's cached table (an empty one when there is none or it cannot be read)."""
    machine = machine_facts()
    path = cache_path(precision, machine)
    try:
        table = load_costs(path)
    except CostTableError:
        return MachineCosts(precision, machine, source="measured")
    table.source = f"cache {path}"
    return table


def measure_costs(graph_def, precision: str = "bfloat16", fetches=(), batch: int | None = None,
                  cache: bool = True, progress=None) -> MachineCosts:
    """This machine's costs for the candidates of a graph: what the cache holds, and the rest measured now.

    Args:
        graph_def: the graph (its library functions are measured too).
        precision: the low precision.
        fetches: the graph's outputs (preserved, as in rewrite_graph_def).
        batch: an unknown leading dimension of the inputs is taken as `batch` (default 1).
        cache: read and update this machine's cache file.
        progress: optional callable (done, total) while measuring.

    Returns:
        A MachineCosts with at least the graph's measurable op signatures.
    """
    from .graph_costs import measure_missing
    table = cached_costs(precision) if cache else MachineCosts(precision, machine_facts())
    table.batch = batch
    if not table.low_units:
        return table
    if measure_missing(table, graph_def, fetches, batch, progress) and cache:
        table.save_to_cache()
        table.source = table.source if table.source != "measured" else "measured (cached)"
    return table


def this_machine(precision: str = "bfloat16") -> MachineCosts:
    """This machine's cached table in measuring mode: each graph given to for_graph (each traced function, in
    training) has what the cache lacks measured first, once per process and machine."""
    table = cached_costs(precision)
    table.measure = True
    return table
