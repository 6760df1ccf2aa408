"""Convert a float32 SavedModel to bfloat16 with Intel Neural Compressor, for tools/bench_saved_model.py.

Runs in Intel Neural Compressor's own environment, not the project's: INC 3.7.1 (the last release with the
TensorFlow `mix_precision` API) needs numpy < 2. Make it once, next to the project:

    python3 -m venv .venv-inc && .venv-inc/bin/pip install "neural-compressor==3.7.1" "tensorflow==2.21.*" "numpy<2"

then pass `--inc-python .venv-inc/bin/python` to the benchmark. Usage: `inc_convert.py SOURCE OUTPUT`; prints one
JSON line {"seconds": conversion wall time, "cpu_seconds": ...}.

INC refuses bfloat16 on a CPU without AVX512-BF16 ("the hardware doesn't support bf16 instruction"); FORCE_BF16=1
is INC's own switch to convert anyway, which this script sets so that the benchmark can compare on any CPU.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("FORCE_BF16", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def main(source: str, output: str) -> None:
    start, start_cpu = time.perf_counter(), time.process_time()
    from neural_compressor import mix_precision
    from neural_compressor.config import MixedPrecisionConfig

    model = mix_precision.fit(source, MixedPrecisionConfig(device="cpu", precisions="bf16"))
    if model is None:
        raise SystemExit("Intel Neural Compressor returned no model (see its log above)")
    model.save(output)
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - start_cpu}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
