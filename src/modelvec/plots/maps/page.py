"""The HTML page of a map: plotly.js inline (it opens offline), and a search box with the script that finds a
model by part of its id and draws its edges in the model tree."""

from __future__ import annotations

import html
from typing import Any


def _html_page(fig: Any, *, sources: list[int], mark: int, page_title: str, tree: dict[str, Any] | None = None) -> str:
    """The whole page: plotly.js inline, the search box over the map and its script run once the map is drawn.

    Nothing from the models reaches the page as markup: names travel as JSON data (plotly escapes ``<``,
    ``>`` and ``/``), the script writes them as text, and the annotation shows plotly's escaped copy. ``tree``
    (rows and trace indices only, no names): each row's parents' rows and the traces of one model's edges.
    """
    import json

    import plotly.io as pio

    script = (
        SEARCH_JS.replace("__SOURCES__", json.dumps([int(i) for i in sources]))
        .replace("__MARK__", str(mark))
        .replace("__TREE__", json.dumps(tree, separators=(",", ":")))
    )
    page = pio.to_html(
        fig,
        include_plotlyjs=True,
        full_html=True,
        include_mathjax=False,
        div_id="modelvec-map",
        post_script=script,
        config={
            "displaylogo": False,
            "responsive": True,
            "toImageButtonOptions": {"format": "png", "filename": "modelvec-map"},
        },
    )
    page = page.replace("<head>", f"<head>\n    <title>{html.escape(page_title)}</title>", 1)
    return page.replace("<body>", f"<body>\n{SEARCH_HTML}", 1)


# The search box: disabled until its script (below) has indexed the map's models. Under it, where the tree is known,
# a line that names the model whose edges are drawn.
SEARCH_HTML = """\
<div id="modelvec-search" style="font: 13px system-ui, sans-serif; padding: 8px 12px 0; color: #333;">
  <label for="modelvec-search-input">find a model</label>
  <input id="modelvec-search-input" type="search" size="40" placeholder="part of its id, e.g. org/name"
         autocomplete="off" spellcheck="false" disabled>
  <span id="modelvec-search-status" role="status" aria-live="polite" style="margin-left: 8px;"></span>
  <div id="modelvec-tree-status" role="status" aria-live="polite" style="margin-top: 4px; min-height: 1em;"></div>
</div>"""
# Run by plotly once the map is drawn ({plot_id}: the map's div). Reads plotly's _fullData (where x and y are
# decoded arrays; the page carries them base64-encoded). Indexes the models of one colouring's traces
# (__SOURCES__; every colouring holds every model), matches a case-insensitive substring of the id, rings the
# matches in the trace __MARK__ and points an arrow at one of them (an exact id first, then in order of id; Enter:
# the next). __TREE__ (null without a tree): each row's parents' rows, and the two traces that draw the edges of the
# model clicked or found, to its parents and to its children (found from the parents once, when the page opens).
# Names are only ever written as text.
SEARCH_JS = """
(function () {
  var gd = document.getElementById('{plot_id}');
  var box = document.getElementById('modelvec-search-input');
  var status = document.getElementById('modelvec-search-status');
  var treeStatus = document.getElementById('modelvec-tree-status');
  var SOURCES = __SOURCES__, MARK = __MARK__, TREE = __TREE__;
  var plain = function (s) {
    return String(s).replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
  };
  var models = [], byRow = [], children = [];
  SOURCES.forEach(function (t) {
    var full = gd._fullData.filter(function (d) { return d.index === t; })[0];
    for (var k = 0; k < full.x.length; k++) {
      var row = full.customdata[k], name = plain(row[0]);
      var model = {name: name, lower: name.toLowerCase(), x: full.x[k], y: full.y[k], row: row};
      models.push(model);
      byRow[row[4]] = model;
    }
  });
  if (TREE) TREE.parents.forEach(function (up, r) {
    up.forEach(function (p) { (children[p] = children[p] || []).push(r); });
  });
  function lines(m, rows) {
    var x = [], y = [];
    rows.forEach(function (r) { var o = byRow[r]; if (o) { x.push(m.x, o.x, null); y.push(m.y, o.y, null); } });
    return [x, y];
  }
  function showTree(m) {  // m: a model of the index, or null to clear
    if (!TREE) return;
    var up = m ? TREE.parents[m.row[4]] : [], down = m ? children[m.row[4]] || [] : [];
    var a = m ? lines(m, up) : [[], []], b = m ? lines(m, down) : [[], []];
    Plotly.restyle(gd, {x: [a[0], b[0]], y: [a[1], b[1]]}, TREE.traces);
    treeStatus.textContent = m ? 'edges of ' + m.name + ': ' + up.length + (up.length === 1 ? ' parent' : ' parents')
      + ' (dark) and ' + down.length + (down.length === 1 ? ' child' : ' children') + ' (light) on the map' : '';
    treeStatus.setAttribute('data-row', m ? String(m.row[4]) : '');
  }
  if (TREE) gd.on('plotly_click', function (event) {
    var p = event && event.points && event.points[0];
    var row = p && (p.customdata || (p.data && p.data.customdata ? p.data.customdata[p.pointNumber] : null));
    if (row && byRow[row[4]]) showTree(byRow[row[4]]);
  });
  var found = [], current = 0;
  function say(query) {
    if (!query) { status.textContent = ''; return; }
    if (!found.length) { status.textContent = 'no model matches \\u201c' + query + '\\u201d'; return; }
    var one = found[current].name;
    status.textContent = found.length === 1 ? '1 model matches: ' + one
      : found.length + ' models match; ' + (current + 1) + ' of ' + found.length + ': ' + one + ' (Enter: next)';
  }
  function draw() {
    var hit = found[current];
    Plotly.restyle(gd, {
      x: [found.map(function (m) { return m.x; })],
      y: [found.map(function (m) { return m.y; })],
      customdata: [found.map(function (m) { return m.row; })]
    }, [MARK]);
    Plotly.relayout(gd, {annotations: hit ? [{
      x: hit.x, y: hit.y, text: '<b>' + hit.row[0] + '</b>', showarrow: true, arrowhead: 2, ax: 40, ay: -40,
      bgcolor: 'rgba(255,255,255,0.9)', bordercolor: '#111111', font: {size: 12}
    }] : []});
    showTree(hit || null);
  }
  function search() {
    var query = box.value.trim(), lower = query.toLowerCase();
    found = lower ? models.filter(function (m) { return m.lower.indexOf(lower) >= 0; }) : [];
    found.sort(function (a, b) {  // the model of that very id first, then by id
      return (a.lower !== lower) - (b.lower !== lower) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    });
    current = 0;
    say(query);
    draw();
  }
  box.addEventListener('input', search);
  box.addEventListener('keydown', function (event) {
    if (event.key !== 'Enter' || found.length < 2) return;
    current = (current + 1) % found.length;
    say(box.value.trim());
    draw();
  });
  box.disabled = false;
  document.getElementById('modelvec-search').setAttribute('data-ready', String(models.length));
})();
"""
