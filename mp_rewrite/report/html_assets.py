"""The page, CSS and JavaScript of the HTML report, all inlined (no network: no CDN, no fonts, no images)."""

import string

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #202124; }
header { background: #263238; color: #fff; padding: 12px 20px; }
header h1 { font-size: 20px; margin: 0 0 4px 0; }
header p { margin: 0; opacity: .85; }
main { padding: 8px 20px 40px 20px; margin-right: 0; }
body.panel-open main { margin-right: 440px; }
h2 { font-size: 17px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 24px; }
table { border-collapse: collapse; margin: 6px 0 14px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.line { margin: 2px 0; }
.grappler { font-family: ui-monospace, Menlo, Consolas, monospace; background: #f1f3f4; padding: 4px 8px;
  display: inline-block; border-radius: 4px; }
.chip { display: inline-block; width: 12px; height: 12px; border: 1px solid #777; vertical-align: middle;
  margin-right: 6px; border-radius: 2px; }
#controls { position: sticky; top: 0; background: #fff; padding: 6px 0; z-index: 2; }
#search { width: 420px; font-size: 14px; padding: 4px 8px; }
#node-table { width: 100%; font-size: 13px; }
#node-table th { cursor: pointer; user-select: none; position: sticky; top: 38px; }
#node-table th.sorted-asc::after { content: " ▲"; }
#node-table th.sorted-desc::after { content: " ▼"; }
#node-table tbody tr { cursor: pointer; }
#node-table tbody tr:hover { outline: 2px solid #1a73e8; }
#node-table tbody tr.selected { outline: 3px solid #1a73e8; }
#node-table td { white-space: nowrap; }
#node-table td.name, #node-table td:last-child { white-space: normal; }
#node-table td.name { font-family: ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
#svg-box { border: 1px solid #ddd; overflow: auto; max-height: 75vh; background: #fff; }
#svg-box svg { display: block; }
#svg-box g.node, #svg-box g.mp-scope { cursor: pointer; }
#svg-box g.mp-selected path, #svg-box g.mp-selected polygon, #svg-box g.mp-selected ellipse {
  stroke: #1a73e8; stroke-width: 4px; }
#panel { position: fixed; right: 0; top: 0; bottom: 0; width: 420px; background: #fafafa;
  border-left: 2px solid #1a73e8; padding: 10px 12px; overflow: auto; display: none; z-index: 5; }
body.panel-open #panel { display: block; }
#panel pre { white-space: pre-wrap; word-break: break-word; font-size: 13px; }
#panel button { float: right; }
.muted { color: #666; }
"""

JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("mp-data").textContent);
  var COLS = ["graph", "name", "op", "class", "dtype", "flops", "reason"];
  var LIMIT = 1000;
  var state = { query: "", cls: "", sortCol: -1, sortDir: 1, selected: -1 };
  var rows = data.nodes.map(function (n, i) {
    return { i: i, cells: [data.graphs[n[0]], n[1], n[2], n[3], n[4], n[5], n[6]],
             hay: (data.graphs[n[0]] + " " + n[1] + " " + n[2] + " " + n[3] + " " + n[4] + " " + n[6]).toLowerCase() };
  });
  var tbody = document.querySelector("#node-table tbody");
  var search = document.getElementById("search");
  var clsSelect = document.getElementById("class-filter");
  var count = document.getElementById("count");

  function matches(row) {
    if (state.cls && row.cells[3] !== state.cls) { return false; }
    var terms = state.query.toLowerCase().split(/\s+/).filter(Boolean);
    for (var t = 0; t < terms.length; t++) { if (row.hay.indexOf(terms[t]) < 0) { return false; } }
    return true;
  }

  function compare(a, b) {
    var x = a.cells[state.sortCol], y = b.cells[state.sortCol];
    if (typeof x === "number" || typeof y === "number") {
      x = (x === null ? -1 : x); y = (y === null ? -1 : y);
      return (x - y) * state.sortDir;
    }
    return String(x).localeCompare(String(y)) * state.sortDir;
  }

  function render() {
    var shown = rows.filter(matches);
    if (state.sortCol >= 0) { shown.sort(compare); }
    var frag = document.createDocumentFragment();
    shown.slice(0, LIMIT).forEach(function (row) {
      var tr = document.createElement("tr");
      tr.dataset.index = row.i;
      tr.dataset.name = row.cells[1];
      tr.className = "row-" + row.cells[3] + (row.i === state.selected ? " selected" : "");
      row.cells.forEach(function (value, c) {
        var td = document.createElement("td");
        if (c === 3) {
          var chip = document.createElement("span");
          chip.className = "chip"; chip.style.background = data.fills[value] || "#fff";
          td.appendChild(chip);
        }
        td.appendChild(document.createTextNode(value === null ? "" : (c === 5 ? value.toLocaleString() : value)));
        if (c === 1) { td.className = "name"; }
        if (c === 5) { td.className = "num"; }
        tr.appendChild(td);
      });
      frag.appendChild(tr);
    });
    tbody.innerHTML = "";
    tbody.appendChild(frag);
    count.textContent = shown.length + " of " + rows.length + " nodes" +
      (shown.length > LIMIT ? " (showing the first " + LIMIT + "; refine the search)" : "");
    document.querySelectorAll("#node-table th").forEach(function (th, c) {
      th.className = c === state.sortCol ? (state.sortDir > 0 ? "sorted-asc" : "sorted-desc") : "";
    });
  }

  function svgNode(index) {
    if (index < 0 || data.pictureGraph === null) { return null; }
    var n = data.nodes[index], name = n[1];
    if (data.graphs[n[0]] !== data.pictureGraph) { return null; }
    var found = null, best = -1;
    document.querySelectorAll("#svg-box g.node").forEach(function (g) {
      var title = g.querySelector("title");
      var t = title ? title.textContent : "";
      if (t === name) { found = g; best = Infinity; return; }
      // A collapsed box holds the node: a name scope "a/b/" or a series "a/AddN_*".
      var inScope = t.slice(-1) === "/" && name.indexOf(t) === 0;
      var inSeries = t.slice(-2) === "_*" && name.indexOf(t.slice(0, -1)) === 0 &&
        /^[0-9]+$/.test(name.slice(t.length - 1));
      if ((inScope || inSeries) && t.length > best) { found = g; best = t.length; }
    });
    return found;
  }

  function select(index, scroll) {
    document.querySelectorAll("#svg-box g.mp-selected").forEach(function (g) { g.classList.remove("mp-selected"); });
    state.selected = index;
    if (index < 0) { document.body.classList.remove("panel-open"); render(); return; }
    var n = data.nodes[index];
    document.getElementById("panel-title").textContent = n[1];
    document.getElementById("explain-text").textContent = data.explanations[n[7]];
    document.body.classList.add("panel-open");
    if (window.mpExplorerReveal) { window.mpExplorerReveal(index); }
    var g = svgNode(index);
    if (g) { g.classList.add("mp-selected"); if (scroll) { g.scrollIntoView({block: "center", inline: "center"}); } }
    render();
  }

  function findNode(name, graph) {
    for (var i = 0; i < data.nodes.length; i++) {
      var n = data.nodes[i];
      if (n[1] === name && (graph === undefined || data.graphs[n[0]] === graph)) { return i; }
    }
    return -1;
  }

  function writeHash() {
    var parts = [];
    if (state.query) { parts.push("search=" + encodeURIComponent(state.query)); }
    if (state.cls) { parts.push("class=" + encodeURIComponent(state.cls)); }
    if (state.selected >= 0) { parts.push("node=" + encodeURIComponent(data.nodes[state.selected][1])); }
    history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname + location.search);
  }

  function readHash() {
    var params = {};
    (location.hash || "").replace(/^#/, "").split("&").forEach(function (kv) {
      if (!kv) { return; }
      var at = kv.indexOf("=");
      var key = at < 0 ? kv : kv.slice(0, at);
      params[key] = at < 0 ? "" : decodeURIComponent(kv.slice(at + 1).replace(/\+/g, " "));
    });
    var q = new URLSearchParams(location.search);
    q.forEach(function (v, k) { if (!(k in params)) { params[k] = v; } });
    state.query = params.search || "";
    state.cls = params["class"] || "";
    search.value = state.query;
    clsSelect.value = state.cls;
    var index = params.node ? findNode(params.node, params.graph) : -1;
    select(index, true);
  }

  search.addEventListener("input", function () { state.query = search.value; render(); writeHash(); });
  clsSelect.addEventListener("change", function () { state.cls = clsSelect.value; render(); writeHash(); });
  document.querySelectorAll("#node-table th").forEach(function (th, c) {
    th.addEventListener("click", function () {
      if (state.sortCol === c) { state.sortDir = -state.sortDir; } else { state.sortCol = c; state.sortDir = 1; }
      render();
    });
  });
  tbody.addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr");
    if (tr) { select(Number(tr.dataset.index), true); writeHash(); }
  });
  window.mpSelect = function (index) { select(index, false); writeHash(); };
  var svgBox = document.getElementById("svg-box");
  if (svgBox) svgBox.addEventListener("click", function (ev) {
    var g = ev.target.closest("g.node");
    if (!g) { return; }
    ev.preventDefault();
    var name = g.querySelector("title").textContent;
    if (g.classList.contains("mp-scope")) {
      state.query = name; search.value = name; select(-1, false); writeHash();
      document.getElementById("nodes").scrollIntoView();
      return;
    }
    var index = findNode(name, data.pictureGraph);
    if (index >= 0) { select(index, false); writeHash(); }
  });
  document.getElementById("panel-close").addEventListener("click", function () { select(-1, false); writeHash(); });
  document.querySelectorAll("[data-zoom]").forEach(function (button) {
    button.addEventListener("click", function () {
      var svg = document.querySelector("#svg-box svg");
      if (!svg) { return; }
      var f = Number(button.dataset.zoom);
      var w = svg.getBoundingClientRect().width;
      svg.style.width = (f === 0 ? document.getElementById("svg-box").clientWidth : w * f) + "px";
      svg.style.height = "auto";
    });
  });
  (function fitPicture() {
    var svg = document.querySelector("#svg-box svg"), box = document.getElementById("svg-box");
    if (!svg || !box.clientWidth) { return; }
    var natural = svg.getBoundingClientRect().width;
    if (natural > box.clientWidth) {
      svg.style.width = Math.max(box.clientWidth, natural * 0.25) + "px";
      svg.style.height = "auto";
    }
  })();
  window.addEventListener("hashchange", readHash);
  readHash();
  document.body.dataset.ready = "1";
})();
"""

PAGE = string.Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>$title</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>$css</style></head>
<body><header><h1>$title</h1>
<p>mixed precision rewrite to $precision on $device ·
click a node in the table or the picture to see why it has its dtype</p></header>
<main>
<section id="summary"><h2>Summary</h2>$summary</section>
<section id="picture"><h2>Picture</h2>
$picture</section>
<section id="nodes"><h2>Nodes</h2>
<div id="controls"><input id="search" type="search" placeholder="search: name, op, color or reason (all words)"
 aria-label="search nodes"> <select id="class-filter" aria-label="color"><option value="">every color</option>
$options</select> <span id="count" class="muted"></span></div>
<table id="node-table"><thead><tr>$headers</tr></thead><tbody></tbody></table></section>
</main>
<aside id="panel"><button id="panel-close" title="close">×</button><h3 id="panel-title"></h3>
<pre id="explain-text"></pre></aside>
<script id="mp-data" type="application/json">$payload</script>
<script>$js</script>
$scripts
</body></html>
""")
"""The page; $$-fields are filled by html.to_html (values HTML-escaped there)."""
