"""The network explorer's markup, CSS and script (inlined into the HTML report; dagre is inlined before the script).

The script reads `data.explorer` (explorer.explorer_data) from the page's JSON, lays the graph out with dagre
(compound nodes: an opened layer is a frame around its ops) and draws it as SVG; drag pans, the wheel zooms, a click
on a layer opens it, a click on an op shows its explanation (the page's panel), the search box finds nodes and
layers. The URL fragment `#find=TEXT` searches on load, `#click=LAYER` clicks that layer's box once drawn (links
and the headless-browser test use them) and `#only=network` hides the summary and the node table. With a time view
(data.explorer.casts/ops/heat, explorer._add_times) the toggle button switches the fills between precision and
time, and each slowest-layer link centres its box; `#show=time` clicks the toggle on load, `#top=N` the N-th link.
"""

import string

EXPLORER_MARKUP = string.Template("""<p class="muted"><b>$title</b></p>$times
<div id="xbar"><input id="xfind" type="search" placeholder="find a node or layer (Enter: go to it)"
 aria-label="find in the network"> <button data-x="fit">fit</button> <button data-x="in">+</button>
 <button data-x="out">−</button> <button data-x="close">close all layers</button> $toggle<span id="xstatus"
 class="muted"></span></div>
$legend<ul id="xnotes" class="muted">$notes
<li>Drag to pan, wheel to zoom; click a layer to open it into its ops (click its frame to close), an op to see why
it has its dtype.</li></ul>
<div id="xbox"><svg id="xsvg" xmlns="http://www.w3.org/2000/svg"><defs><marker id="xarrow" viewBox="0 0 10 10"
 refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"
 fill="#555"/></marker></defs><g id="xview"></g></svg></div>""")

EXPLORER_CSS = """
body.network-only #summary, body.network-only #nodes { display: none; }
#xbar { margin: 6px 0; } #xfind { width: 360px; font-size: 14px; padding: 3px 8px; }
#xlegend, #xlegend-time { font-size: 12px; margin: 4px 0; } .xchip { margin-right: 14px; white-space: nowrap; }
#xlegend-time, body.time-view #xlegend { display: none; } body.time-view #xlegend-time { display: block; }
#xslowest { font-size: 13px; } #xtotal { margin: 4px 0; }
#xsvg .xnode.xgoto .xoutline { stroke: #e8710a; stroke-width: 4px; }
.xcast { border: 1px dashed #c5221f; color: #c5221f; border-radius: 7px; padding: 0 5px; margin-right: 6px;
  font-size: 10px; }
#xnotes { font-size: 12px; margin: 4px 0 6px 0; padding-left: 18px; }
#xbox { border: 1px solid #ddd; height: 78vh; overflow: hidden; background: #fff; cursor: grab; }
#xsvg { width: 100%; height: 100%; display: block; user-select: none; }
#xsvg .xnode { cursor: pointer; } #xsvg .xframe { cursor: zoom-out; }
#xsvg .xnode.xmatch .xoutline { stroke: #1a73e8; stroke-width: 3px; }
#xsvg .xnode.xsel .xoutline { stroke: #e8710a; stroke-width: 4px; }
"""

EXPLORER_JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("mp-data").textContent);
  var X = data.explorer, NS = "http://www.w3.org/2000/svg";
  if (!X || typeof dagre === "undefined") { return; }
  var svg = document.getElementById("xsvg"), view = document.getElementById("xview");
  var box = document.getElementById("xbox"), status = document.getElementById("xstatus");
  var find = document.getElementById("xfind");
  var open = {}, layerOf = {}, tf = { x: 0, y: 0, k: 1 }, current = null, selected = -1, query = "";
  var mode = "precision", goto = -1;
  X.layers.forEach(function (L, i) { L.members.forEach(function (m) { layerOf[m] = i; }); });

  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function msText(ms) {  // as layer_times.ms_text
    if (ms >= 100) { return ms.toFixed(0); } if (ms >= 10) { return ms.toFixed(1); }
    if (ms >= 0.1) { return ms.toFixed(2); } return ms >= 0.001 ? ms.toFixed(3) : "<0.001";
  }
  function opened(i) { return !!open[i] && X.layers[i].members.length > 1; }
  function idOf(m) { return opened(layerOf[m]) ? "n" + m : "L" + layerOf[m]; }
  function size(lines) {
    var w = 120;
    lines.forEach(function (s, i) { w = Math.max(w, s.length * (i ? 5.6 : 6.8) + 16); });
    return { width: w, height: lines.length * 14 + 8 };
  }
  function opLines(m) {
    // the op's name inside its layer ("query_1/einsum/Einsum" in an attention layer), cut from the left
    var n = data.nodes[m], key = X.layers[layerOf[m]].key;
    var name = n[1].indexOf(key) === 0 ? n[1].slice(key.length) : n[1].split("/").slice(-2).join("/");
    if (name.length > 32) { name = "…" + name.slice(-31); }
    var lines = [name, n[2] + (n[4] ? " " + n[4] : "")];
    if (X.ops && X.ops[m]) { lines.push(X.ops[m][3]); }
    return lines;
  }
  function layerLines(L) { return L.tline ? L.lines.concat([L.tline], L.kline ? [L.kline] : []) : L.lines; }

  function layout() {
    var g = new dagre.graphlib.Graph({ compound: true });
    g.setGraph({ rankdir: "TB", nodesep: 22, ranksep: 34, marginx: 20, marginy: 20 });
    g.setDefaultEdgeLabel(function () { return {}; });
    X.layers.forEach(function (L, i) {
      if (!opened(i)) {
        var lines = layerLines(L), s = size(lines);
        g.setNode("L" + i, { layer: i, lines: lines, classes: L.classes, width: s.width, height: s.height });
        return;
      }
      g.setNode("C" + i, { frame: i, paddingTop: 22 });
      L.members.forEach(function (m) {
        var lines = opLines(m), s = size(lines);
        g.setNode("n" + m, { op: m, lines: lines, classes: [[data.nodes[m][3], 1]], width: s.width, height: s.height });
        g.setParent("n" + m, "C" + i);
      });
    });
    var merged = {};
    X.edges.forEach(function (e) {
      var a = idOf(e[0]), b = idOf(e[1]);
      if (a === b) { return; }
      var x = merged[a + ">" + b] || (merged[a + ">" + b] = { a: a, b: b, count: 0, casts: {}, castIds: {} });
      x.count += 1;
      if (e[2]) { e[2].split(",").forEach(function (c) { x.casts[c] = (x.casts[c] || 0) + 1; }); }
      e[3].forEach(function (c) { x.castIds[c] = true; });
    });
    var fanout = {};
    Object.keys(merged).forEach(function (k) { fanout[merged[k].a] = (fanout[merged[k].a] || 0) + 1; });
    Object.keys(merged).forEach(function (k, n) {
      var e = merged[k], src = g.node(e.a);
      // an input read by many layers (a padding mask) is drawn above each reader, not once with long edges
      if (src && src.layer !== undefined && X.layers[src.layer].kind === "input" && fanout[e.a] >= 3) {
        var copy = e.a + "#" + n;
        g.setNode(copy, Object.assign({}, src));
        e.a = copy;
      }
      g.setEdge(e.a, e.b, e);
    });
    Object.keys(fanout).forEach(function (id) {
      var n = g.node(id);
      if (fanout[id] >= 3 && n && n.layer !== undefined && X.layers[n.layer].kind === "input") { g.removeNode(id); }
    });
    dagre.layout(g);
    return g;
  }

  function drawBox(id, n, parent) {
    var key = n.layer !== undefined ? X.layers[n.layer].key : data.nodes[n.op][1];
    var g = el("g", { "class": "xnode", "data-key": key }, parent);
    if (n.layer !== undefined) { g.setAttribute("data-layer", n.layer); } else { g.setAttribute("data-op", n.op); }
    el("title", {}, g).textContent = key;
    var heat = mode !== "time" ? null : n.layer !== undefined ? X.layers[n.layer].heat :
      (X.ops && X.ops[n.op] ? X.ops[n.op][2] : X.noTime);
    var stripes = heat ? [["heat", 1, heat]] : n.classes.map(function (c) {
      return [c[0], c[1], data.fills[c[0]] || "#eee"]; });
    var total = stripes.reduce(function (s, c) { return s + c[1]; }, 0), left = n.x - n.width / 2;
    stripes.forEach(function (c) {
      var w = n.width * c[1] / total;
      el("rect", { x: left, y: n.y - n.height / 2, width: w, height: n.height, fill: c[2], "class": "mp-" + c[0] }, g);
      left += w;
    });
    el("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height, fill: "none",
                 stroke: "#333", "stroke-width": 1.2, "class": "xoutline", rx: 3 }, g);
    n.lines.forEach(function (line, i) {
      var t = el("text", { x: n.x, y: n.y - n.height / 2 + 15 + 14 * i, "text-anchor": "middle",
                           "font-size": i ? 9.5 : 11, "font-weight": i ? "normal" : "bold",
                           "font-family": "Helvetica,Arial,sans-serif" }, g);
      t.textContent = line;
    });
    return g;
  }

  function drawEdge(e, parent, marks) {
    var pts = e.points.map(function (p) { return p.x.toFixed(1) + "," + p.y.toFixed(1); });
    el("path", { d: "M" + pts.join(" L"), fill: "none", stroke: "#555", "marker-end": "url(#xarrow)",
                 "stroke-width": Math.min(1.2 + (e.count - 1) * 0.5, 3.2) }, parent);
    var names = Object.keys(e.casts);
    if (!names.length) { return; }
    var text = names.map(function (c) { return e.casts[c] > 1 ? e.casts[c] + "× " + c : c; }).join(", ");
    if (X.casts) {
      var ms = Object.keys(e.castIds).reduce(function (s, c) { return s + X.casts[c]; }, 0);
      text += " " + msText(ms) + " ms";
    }
    var a = e.points[e.points.length - 2], b = e.points[e.points.length - 1];
    var mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2, w = text.length * 5.4 + 10;
    var g = el("g", { "class": "xcast-mark" }, marks);
    el("title", {}, g).textContent = "Casts inserted on this edge: " + text;
    el("rect", { x: mx - w / 2, y: my - 7, width: w, height: 14, rx: 7, fill: "#fff", stroke: "#c5221f",
                 "stroke-dasharray": "3,2" }, g);
    el("text", { x: mx, y: my + 3.5, "text-anchor": "middle", "font-size": 9, fill: "#c5221f",
                 "font-family": "Helvetica,Arial,sans-serif" }, g).textContent = text;
  }

  function draw() {
    var g = layout();
    current = g;
    view.textContent = "";
    var frames = el("g", {}, view), edges = el("g", {}, view), nodes = el("g", {}, view), marks = el("g", {}, view);
    g.nodes().forEach(function (id) {
      var n = g.node(id);
      if (n.frame !== undefined) {
        var f = el("g", { "class": "xframe", "data-layer": n.frame, "data-key": X.layers[n.frame].key }, frames);
        el("title", {}, f).textContent = X.layers[n.frame].key + " (click to close)";
        el("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height, rx: 6,
                     fill: "#f8f9fa", stroke: "#5f6368", "stroke-dasharray": "5,3" }, f);
        el("text", { x: n.x - n.width / 2 + 4, y: n.y - n.height / 2 - 5, "font-size": 11, "font-weight": "bold",
                     "font-family": "Helvetica,Arial,sans-serif" }, f).textContent = "▾ " + X.layers[n.frame].lines[0];
      } else {
        drawBox(id, n, nodes);
      }
    });
    g.edges().forEach(function (e) { drawEdge(g.edge(e), edges, marks); });
    view.setAttribute("data-open", Object.keys(open).filter(opened).map(function (i) {
      return X.layers[i].key; }).join("|"));
    mark();
  }

  function apply() { view.setAttribute("transform", "translate(" + tf.x + "," + tf.y + ") scale(" + tf.k + ")"); }
  function fit(all) {
    var w = current.graph().width, h = current.graph().height, cw = box.clientWidth || 800, ch = box.clientHeight || 600;
    tf.k = Math.min(1, cw / w, all ? ch / h : 1);
    tf.x = Math.max(0, (cw - w * tf.k) / 2); tf.y = 0; apply();
  }
  function centre(id) {
    var n = current.node(id);
    if (!n) { return; }
    tf.k = Math.max(tf.k, 0.8);
    tf.x = (box.clientWidth || 800) / 2 - n.x * tf.k; tf.y = (box.clientHeight || 600) / 2 - n.y * tf.k; apply();
  }

  function matchesLayer(i) {
    if (!query) { return false; }
    var L = X.layers[i];
    if (L.key.toLowerCase().indexOf(query) >= 0) { return true; }
    return L.members.some(function (m) { return data.nodes[m][1].toLowerCase().indexOf(query) >= 0; });
  }
  function mark() {
    var count = 0;
    view.querySelectorAll(".xnode").forEach(function (g) {
      var hit = g.hasAttribute("data-layer") ? matchesLayer(Number(g.getAttribute("data-layer"))) :
        !!query && g.getAttribute("data-key").toLowerCase().indexOf(query) >= 0;
      g.classList.toggle("xmatch", hit);
      var members = g.hasAttribute("data-layer") ? X.layers[Number(g.getAttribute("data-layer"))].members : [];
      g.classList.toggle("xsel", g.hasAttribute("data-op") ? Number(g.getAttribute("data-op")) === selected :
        members.length === 1 && members[0] === selected);
      g.classList.toggle("xgoto", g.hasAttribute("data-layer") && Number(g.getAttribute("data-layer")) === goto);
      if (hit) { count += 1; }
    });
    status.textContent = query ? count + " box(es) match" : X.layers.length + " boxes; " + X.graph;
  }

  function reveal(m, explain) {
    if (layerOf[m] === undefined) { return false; }
    var l = layerOf[m];
    if (X.layers[l].members.length > 1 && !open[l]) { open[l] = true; draw(); }
    selected = m; mark(); centre(idOf(m));
    if (explain && window.mpSelect) { window.mpSelect(m); }
    return true;
  }
  function go(text) {
    query = text.trim().toLowerCase(); mark();
    if (!query) { return; }
    var exact = -1, first = -1;
    X.layers.forEach(function (L) { L.members.forEach(function (m) {
      var name = data.nodes[m][1].toLowerCase();
      if (name === query && exact < 0) { exact = m; }
      if (first < 0 && name.indexOf(query) >= 0) { first = m; }
    }); });
    if (exact >= 0 || first >= 0) { reveal(exact >= 0 ? exact : first, true); }
  }

  svg.addEventListener("click", function (ev) {
    if (svg.dataset.dragged === "1") { return; }
    var node = ev.target.closest(".xnode"), frame = ev.target.closest(".xframe");
    if (node && node.hasAttribute("data-layer")) {
      var i = Number(node.getAttribute("data-layer"));
      if (X.layers[i].members.length > 1) { open[i] = true; draw(); centre("C" + i); }
      else { reveal(X.layers[i].members[0], true); }
    } else if (node) {
      reveal(Number(node.getAttribute("data-op")), true);
    } else if (frame) {
      var j = Number(frame.getAttribute("data-layer"));
      delete open[j]; draw(); centre("L" + j);
    }
  });
  var drag = null;
  svg.addEventListener("mousedown", function (ev) { drag = { x: ev.clientX, y: ev.clientY, tx: tf.x, ty: tf.y };
    svg.dataset.dragged = "0"; });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) { return; }
    if (Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y) > 3) { svg.dataset.dragged = "1"; }
    tf.x = drag.tx + ev.clientX - drag.x; tf.y = drag.ty + ev.clientY - drag.y; apply();
  });
  window.addEventListener("mouseup", function () { drag = null; });
  function zoom(f, px, py) {
    px = px === undefined ? box.clientWidth / 2 : px; py = py === undefined ? box.clientHeight / 2 : py;
    var k = Math.min(4, Math.max(0.05, tf.k * f));
    tf.x = px - (px - tf.x) * k / tf.k; tf.y = py - (py - tf.y) * k / tf.k; tf.k = k; apply();
  }
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var r = svg.getBoundingClientRect();
    zoom(Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
  }, { passive: false });
  document.querySelectorAll("[data-x]").forEach(function (b) {
    b.addEventListener("click", function () {
      var act = b.getAttribute("data-x");
      if (act === "fit") { fit(true); } else if (act === "in") { zoom(1.25); } else if (act === "out") { zoom(0.8); }
      else if (act === "mode") { setMode(mode === "time" ? "precision" : "time"); }
      else { open = {}; draw(); fit(false); }
    });
  });
  function setMode(m) {
    // the toggle: the same layout, the boxes filled by precision or by time (and the legend that goes with it)
    mode = m;
    document.body.classList.toggle("time-view", m === "time");
    document.getElementById("xmode").textContent = m === "time" ? "color by precision" : "color by time";
    var keep = view.getAttribute("transform");
    draw();
    if (keep) { view.setAttribute("transform", keep); }
  }
  function goTo(key) {
    // a slowest-layer link: show the explorer and centre the layer's box (or its frame when it is open)
    var i = X.layers.findIndex(function (L) { return L.key === key; });
    if (i < 0) { return; }
    goto = i; mark();
    centre(opened(i) ? "C" + i : "L" + i);
    document.getElementById("xbar").scrollIntoView();
    view.setAttribute("data-goto", key);
  }
  document.querySelectorAll("[data-goto]").forEach(function (a) {
    a.addEventListener("click", function (ev) { ev.preventDefault(); goTo(a.getAttribute("data-goto")); });
  });
  find.addEventListener("input", function () { query = find.value.trim().toLowerCase(); mark(); });
  find.addEventListener("keydown", function (ev) { if (ev.key === "Enter") { go(find.value); } });
  window.mpExplorerReveal = function (m) { return reveal(m, false); };

  var started = performance.now();
  draw(); fit(false);
  document.body.dataset.layoutMs = String(Math.round(performance.now() - started));
  var params = {};
  (location.hash || "").replace(/^#/, "").split("&").forEach(function (kv) {
    var at = kv.indexOf("=");
    if (at > 0) { params[kv.slice(0, at)] = decodeURIComponent(kv.slice(at + 1).replace(/\+/g, " ")); }
  });
  if (params.find) { find.value = params.find; go(params.find); }
  if (params.click) {
    var target = null;
    view.querySelectorAll(".xnode[data-layer]").forEach(function (g) {
      if (g.getAttribute("data-key") === params.click) { target = g; } });
    if (target) { target.querySelector("rect").dispatchEvent(new MouseEvent("click", { bubbles: true })); }
  }
  if (params.only === "network") { document.body.classList.add("network-only"); }
  var toggle = document.getElementById("xmode");
  if (toggle && (params.show || toggle.getAttribute("data-show")) === "time") {
    toggle.dispatchEvent(new MouseEvent("click", { bubbles: true }));
  }
  if (params.find || params.click) { document.getElementById("xbar").scrollIntoView(); }
  var links = document.querySelectorAll("#xslowest [data-goto]");
  if (params.top && links[Number(params.top) - 1]) {
    links[Number(params.top) - 1].dispatchEvent(new MouseEvent("click", { bubbles: true, cancelable: true }));
    document.body.dataset.scrollY = String(Math.round(window.scrollY));
  }
  document.body.dataset.explorer = "ready";
})();
"""
