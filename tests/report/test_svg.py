"""Pictures on a machine without Graphviz: `inspect --format svg/html` lay the graph out in Python, and the SVG
renders (rasterized with cairosvg, a pure-pip renderer) to a picture with the decisions' colors in it."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mp_rewrite.report.palette import FILL
from mp_rewrite.testing import example_models


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("svg") / "cnn"
    example_models.cnn_bn(image_size=16).export(str(path), verbose=False)
    return path


def _without_dot(tmp_path: Path) -> dict:
    """An environment whose PATH has this Python's scripts and the system's basics, but no Graphviz `dot`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    assert shutil.which("dot", path=env["PATH"]) is None
    return env


def _colors(png: bytes) -> set:
    from PIL import Image
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    return {"#%02x%02x%02x" % tuple(int(c) for c in pixel) for pixel in np.unique(image, axis=0)}


@pytest.mark.parametrize("fmt", ["svg", "html"])
def test_pictures_without_graphviz_render_with_the_decision_colors(model, tmp_path, fmt):
    out = tmp_path / f"report.{fmt}"
    proc = subprocess.run([sys.executable, "-m", "mp_rewrite", "inspect", str(model), "--format", fmt,
                           "--precision", "bfloat16", "-o", str(out)], capture_output=True, text=True,
                          env=_without_dot(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    if fmt == "html":  # the page lays the network out in the browser (test_whole_model.py renders it in Chromium)
        import json
        data = json.loads(text.split('<script id="mp-data" type="application/json">', 1)[1].split("</script>")[0])
        layers = data["explorer"]["layers"]
        assert len(layers) > 5 and any(c == "allow" for layer in layers for c, _ in layer["classes"])
        assert "dagre" in text and "No picture" not in text
        return
    svg = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    assert svg.count('class="node ') > 5 and "No picture" not in text
    import cairosvg
    colors = _colors(cairosvg.svg2png(bytestring=svg.encode(), output_width=1200))
    assert {FILL["allow"], "#ffffff"} <= colors, "the picture has no converted (allow) box"
