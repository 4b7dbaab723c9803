"""The figures: maps (grouping and colours, PNG, self-contained HTML, the HTML checked in a real headless Chromium,
maps of many models) and the rank study's figure. The 2-D reduction they draw is tested in
tests/analyse/test_reduction.py."""

from __future__ import annotations

import html
import math
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from modelvec.analyse.tree import Node, Tree
from modelvec.plots.maps import PALETTE, grouping, map_figure, plot_html, plot_png
from modelvec.plots.maps.groups import OTHER_COLOR, UNLABELLED_COLOR
from modelvec.plots.maps.interactive import ALL_EDGES_UP_TO
from modelvec.plots.tree import KIND_COLOURS

# --- grouping ------------------------------------------------------------------------------


def make_meta(datasets: list, authors: list | None = None, sources: list | None = None) -> pd.DataFrame:
    n = len(datasets)
    return pd.DataFrame(
        {
            "model": [f"org{i % 3}/model-{i}" for i in range(n)],
            "datasets": datasets,
            "label_source": sources if sources is not None else [("card" if d else None) for d in datasets],
            "author": authors if authors is not None else [f"org{i % 3}" for i in range(n)],
        }
    )


def test_grouping_first_dataset_missing_values_and_order():
    meta = make_meta(
        [["b"], ["a", "b"], np.array(["a"]), [], None, float("nan"), "c", ["b"]],
        sources=["card", "card", "card", None, None, float("nan"), "card", "hub"],
    )
    g = grouping(meta)
    assert g.labels == ("b", "a", "a", None, None, None, "c", "b")
    assert list(g.colors) == ["a", "b", "c"]  # largest first, ties by name
    assert g.counts == {"a": 2, "b": 2, "c": 1}
    assert list(g.colors.values()) == list(PALETTE[:3])
    assert (g.n_none, g.n_groups, g.multi) == (3, 3, 1)
    assert UNLABELLED_COLOR not in PALETTE and OTHER_COLOR not in PALETTE
    assert len(set(PALETTE)) == len(PALETTE) == 18
    by_source = grouping(meta, "label_source")
    assert by_source.counts == {"card": 4, "hub": 1} and by_source.n_none == 3
    assert by_source.none_name == "no label source"
    with pytest.raises(ValueError, match="color_by"):
        grouping(meta, "colour")


def test_grouping_lumps_the_smallest_groups_beyond_the_palette():
    datasets = [[f"d{k:02d}"] for k in range(25) for _ in range(25 - k)]
    g = grouping(make_meta(datasets))
    assert len(g.colors) == 18 and g.n_groups == 25
    assert list(g.colors)[-1] == "8 other datasets" and g.colors["8 other datasets"] == OTHER_COLOR
    assert g.counts["8 other datasets"] == sum(range(1, 9))
    assert list(g.colors)[:17] == [f"d{k:02d}" for k in range(17)]


# --- PNG -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def picture() -> tuple[np.ndarray, pd.DataFrame]:
    """Datasets planted left (alpha), middle (beta) and right (gamma), unlabelled models above them."""
    rng = np.random.default_rng(4)
    xs = {"alpha": -10.0, "beta": 0.0, "gamma": 10.0}
    coords, datasets = [], []
    for name, x in xs.items():
        for _ in range(8):
            coords.append((x + rng.normal(), rng.normal()))
            datasets.append([name])
    datasets[0] = ["alpha", "gamma"]  # coloured by its first dataset
    for i in range(6):
        coords.append((-10 + 4 * i, 6 + rng.normal() * 0.3))
        datasets.append([])
    meta = make_meta(datasets)
    return np.array(coords), meta


def colour_mask(image: np.ndarray, hex_colour: str, alpha: float, tol: float = 0.04) -> np.ndarray:
    """Pixels within ``tol`` of ``hex_colour`` drawn with ``alpha`` over white."""
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    expected = alpha * rgb + (1 - alpha)
    return (np.abs(image[..., :3] - expected) <= tol).all(axis=-1)


def test_plot_png_draws_each_dataset_in_its_colour_where_it_lies(picture, tmp_path):
    coords, meta = picture
    path = plot_png(coords, meta, tmp_path / "sub" / "map.png", reducer="tsne", title="planted", subtitle="test")
    assert path == tmp_path / "sub" / "map.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary file left behind
    image = imread(path)
    assert image.shape[0] > 500 and image.shape[1] > 800
    assert (image[..., :3] < 0.9).any(axis=-1).mean() > 0.01  # not blank
    colours = grouping(meta).colors
    assert list(colours) == ["alpha", "beta", "gamma"]
    columns = {}
    for name, colour in colours.items():
        mask = colour_mask(image, colour, alpha=0.9)
        assert mask.sum() > 400, f"{name}: only {mask.sum()} pixels of {colour}"
        columns[name] = np.median(np.nonzero(mask)[1])
    assert columns["alpha"] < columns["beta"] < columns["gamma"]  # each colour where its points are
    assert colour_mask(image, UNLABELLED_COLOR, alpha=0.6, tol=0.02).sum() > 100  # unlabelled: faint grey


def test_plot_png_other_colourings_and_validation(picture, tmp_path):
    coords, meta = picture
    assert plot_png(coords, meta, tmp_path / "a.png", color_by="author").exists()
    assert plot_png(coords[:1], meta.iloc[:1], tmp_path / "one.png").exists()
    with pytest.raises(ValueError, match="rows"):
        plot_png(coords[:-1], meta, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        plot_png(np.zeros((len(meta), 3)), meta, tmp_path / "x.png")
    with pytest.raises(ValueError, match="color_by"):
        plot_png(coords, meta, tmp_path / "x.png", color_by="size")
    assert not (tmp_path / "x.png").exists()


# --- HTML ----------------------------------------------------------------------------------

NETWORK_REF = re.compile(
    r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE
)


def test_plot_html_is_self_contained_and_names_every_model(picture, tmp_path):
    coords, meta = picture
    path = plot_html(coords, meta, tmp_path / "deep" / "map.html", title="planted <map>", reducer="pca")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") or page.lower().startswith("<html")
    assert "plotly.js v" in page  # the library itself is in the page
    assert not NETWORK_REF.search(page)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)  # every script is inline
    data = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), page)  # plotly writes / as \u002f
    for model in meta["model"]:
        assert f'"{model}"' in data
    assert "<title>planted &lt;map&gt;</title>" in page
    assert "PC 1" in page and "colour by author" in page and "colour by label source" in page


# --- the HTML in a real browser ------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
# No network: nothing in the page needs it, and the browser must not phone home either.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--enable-unsafe-swiftshader",  # WebGL (the large maps' scattergl) on the CPU, where newer Chromium asks for it
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
    "--no-default-browser-check",
]
POSITION_JS = """(id) => {
  const gd = document.getElementById('modelvec-map');
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  for (const trace of gd._fullData) {
    if (trace.visible !== true || !trace.customdata) continue;  // the tree's edges name no model
    const k = Array.from(trace.customdata, (row) => row[0]).indexOf(id);
    if (k >= 0) return [box.left + xa._offset + xa.l2p(trace.x[k]), box.top + ya._offset + ya.l2p(trace.y[k])];
  }
  return null;
}"""


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (`apt-get install chromium`, `make test` does)")
    try:
        from playwright.sync_api import sync_playwright  # the Python package only: never `playwright install`
    except ImportError:
        pytest.fail(
            "the playwright Python package is missing: `pip install playwright` (a dev dependency; it drives "
            f"{CHROMIUM}, so do not run `playwright install`)"
        )

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page_of(chromium, picture, tmp_path):
    """Open the map of ``picture`` as a file:// page; returns (page, meta, requested URLs)."""
    coords, meta = picture
    path = plot_html(coords, meta, tmp_path / "map.html", title="planted", reducer="tsne")
    context = chromium.new_context(viewport={"width": 1200, "height": 820}, offline=True)
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector(".scatterlayer .point", timeout=15_000)
    yield page, meta, requests
    context.close()


def point_count(page) -> int:
    return page.locator(".scatterlayer .point").count()


def test_browser_draws_every_point_offline_and_hover_names_the_model(page_of, tmp_path):
    page, meta, requests = page_of
    assert point_count(page) == len(meta)
    assert [url for url in requests if not url.startswith(("file:", "data:", "blob:", "about:"))] == []
    shot = tmp_path / "screenshot.png"
    page.screenshot(path=str(shot))
    image = imread(shot)
    for name, colour in grouping(meta).colors.items():
        assert colour_mask(image, colour, alpha=0.9, tol=0.06).sum() > 200, f"{name} is not drawn"

    for i in (1, 9, 17, len(meta) - 1):  # alpha, beta, gamma, an unlabelled model
        row = meta.iloc[i]
        x, y = page.evaluate(POSITION_JS, row["model"])
        page.mouse.move(5, 5)
        page.mouse.move(x, y)
        label = page.wait_for_selector(".hovertext", timeout=5_000)
        text = label.text_content()
        assert row["model"] in text
        assert f"datasets: {', '.join(row['datasets']) or '—'}" in text
        assert f"author: {row['author']}" in text
        if i == 1:
            page.screenshot(path=str(tmp_path / "screenshot-hover.png"))  # for a person to look at
    x, y = page.evaluate(POSITION_JS, meta["model"][0])  # two datasets: both in the hover text
    page.mouse.move(x, y)
    page.wait_for_function(
        "() => (document.querySelector('.hovertext') || {}).textContent?.includes('alpha, gamma')", timeout=5_000
    )


def test_browser_legend_filters_and_buttons_switch_the_colouring(page_of):
    page, meta, _ = page_of
    assert page.locator(".legend .legendtitletext").text_content() == "dataset (first listed)"
    legend = page.locator(".legend .traces")
    assert [t.strip() for t in legend.all_text_contents()] == ["alpha (8)", "beta (8)", "gamma (8)", "unlabelled (6)"]
    legend.filter(has_text="beta").locator(".legendtoggle").click()  # hide a dataset
    page.wait_for_function(
        f"() => document.querySelectorAll('.scatterlayer .point').length === {len(meta) - 8}", timeout=5_000
    )

    page.locator(".updatemenu-button", has_text="colour by author").click()
    page.wait_for_function(
        "() => document.querySelector('.legend .legendtitletext')?.textContent === 'author'", timeout=5_000
    )
    authors = sorted(t.strip() for t in legend.all_text_contents())
    assert authors == ["org0 (10)", "org1 (10)", "org2 (10)"]
    assert point_count(page) == len(meta)

    page.locator(".updatemenu-button", has_text="colour by label source").click()
    page.wait_for_function(
        "() => document.querySelector('.legend .legendtitletext')?.textContent === 'label source'", timeout=5_000
    )
    assert [t.strip() for t in legend.all_text_contents()] == ["card (24)", "no label source (6)"]
    assert point_count(page) == len(meta)


# --- maps of many models: density, WebGL, search ------------------------------------------------------------------

N_CROWD = 10_000


@pytest.fixture(scope="module")
def crowd() -> tuple[np.ndarray, pd.DataFrame]:
    """10,000 made-up models of 20 datasets: Gaussian blobs of 82 to 1,118 models and different spreads, some of
    them overlapping; 5 % unlabelled. Ids ``org<k>/ft-<5 digits>``, so ``ft-01234`` names one model."""
    rng = np.random.default_rng(10)
    centers = rng.uniform(-30, 30, size=(20, 2))
    which = rng.choice(20, size=N_CROWD, p=rng.dirichlet(np.full(20, 1.5)))
    spread = rng.uniform(1.0, 4.0, size=20)
    coords = centers[which] + rng.normal(size=(N_CROWD, 2)) * spread[which, None]
    datasets = [[f"dataset-{w:02d}"] for w in which]
    for i in rng.choice(N_CROWD, size=N_CROWD // 20, replace=False):
        datasets[i] = []
    meta = pd.DataFrame(
        {
            "model": [f"org{i % 37}/ft-{i:05d}" for i in range(N_CROWD)],
            "datasets": datasets,
            "author": [f"org{i % 37}" for i in range(N_CROWD)],
        }
    )
    return coords, meta


def test_png_of_many_models_shades_their_density_under_small_translucent_points(crowd, picture, tmp_path, capsys):
    from matplotlib.collections import PathCollection, PolyCollection

    coords, meta = crowd
    fig = map_figure(coords, meta, title="10,000 fine-tunes")
    ax = fig.axes[0]
    density = [c for c in ax.collections if c.get_gid() == "modelvec-density"]
    assert len(density) == 1 and isinstance(density[0], PolyCollection)
    counts = np.asarray(density[0].get_array())
    assert counts.sum() == N_CROWD and counts.min() >= 1  # every model in a hexagon, empty ones not drawn
    assert counts.max() >= 20  # points pile up: the shades tell how many
    assert any(a.get_xlabel() == "models per hexagon" for a in ax.child_axes)  # the shades' colour bar

    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in points) == N_CROWD
    assert all(c.get_sizes().max() < 5 and not np.any(c.get_linewidths()) for c in points)  # small, no edges
    by_size = sorted((len(c.get_offsets()), c.get_alpha()) for c in points)
    assert by_size[-1][1] < 0.5  # the largest group is translucent: its core deepens rather than flattens
    assert by_size[0][1] > by_size[-1][1]  # and the smallest stays more opaque, visible among thousands
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    lumped = grouping(meta).counts["3 other datasets"]  # 17 colours, the 3 smallest datasets lumped, unlabelled
    assert len(legend) == 19 and legend[-2:] == [f"3 other datasets ({lumped})", f"unlabelled ({N_CROWD // 20})"]

    small = map_figure(*picture).axes[0]  # a small map stays as it was: points alone
    assert not [c for c in small.collections if c.get_gid() == "modelvec-density"]

    start = time.perf_counter()
    path = plot_png(coords, meta, tmp_path / "crowd.png", title="10,000 fine-tunes", subtitle="made up")
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n[maps] PNG of {N_CROWD} models drawn and written in {seconds:.2f} s")
    image = imread(path)
    rgb = image[..., :3]
    grey = (np.ptp(rgb, axis=-1) < 0.01) & (rgb[..., 0] > 0.45) & (rgb[..., 0] < 0.96)
    assert len(np.unique(np.round(rgb[grey, 0], 2))) >= 10  # many shades of density, not one blob


def plotted(page: str) -> tuple[list[dict], dict]:
    """The traces and the layout a page passes to ``Plotly.newPlot``."""
    import json

    decoder = json.JSONDecoder()
    at = re.search(r'Plotly\.newPlot\(\s*"modelvec-map",\s*', page).end()
    data, end = decoder.raw_decode(page, at)
    layout, _ = decoder.raw_decode(page, re.match(r",\s*", page[end:]).end() + end)
    return data, layout


def test_html_of_many_models_draws_with_webgl_and_has_a_search_box(crowd, picture, tmp_path):
    coords, meta = crowd
    page = plot_html(coords, meta, tmp_path / "crowd.html", title="10,000 fine-tunes").read_text(encoding="utf-8")
    data, layout = plotted(page)
    assert {trace["type"] for trace in data} == {"scattergl"}
    shown = [trace for trace in data if trace.get("visible") is True and trace.get("name") != "search"]
    assert sum(len(trace["customdata"]) for trace in shown) == N_CROWD  # the dataset colouring: every model
    (search,) = [trace for trace in data if trace.get("name") == "search"]
    assert search["showlegend"] is False and len(search["x"]) == 0  # empty until something is searched
    for button in layout["updatemenus"][0]["buttons"]:  # the rings stay visible whatever the colouring
        assert button["args"][0]["visible"][data.index(search)] is True
    assert 'id="modelvec-search-input"' in page and 'id="modelvec-search-status"' in page
    assert not NETWORK_REF.search(page)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)

    small, _ = plotted(plot_html(*picture, tmp_path / "small.html").read_text(encoding="utf-8"))
    assert {trace["type"] for trace in small} == {"scatter"}  # SVG below WEBGL_FROM models


SEARCH = "#modelvec-search-input"
STATUS_IS = "([text]) => document.getElementById('modelvec-search-status').textContent === text"
MARKED = """() => {
  const gd = document.getElementById('modelvec-map');
  const mark = gd.data.find((trace) => trace.name === 'search');  // visible: not switched off by a colouring
  return [mark.visible !== false, mark.x.length, Array.from(gd.querySelectorAll('.annotation-text'), (a) => a.textContent)];
}"""


def test_browser_opens_the_map_of_10000_models_finds_one_by_name_and_names_it_on_hover(
    chromium, crowd, crowd_tree, tmp_path, capsys
):
    coords, meta = crowd
    tree, picked = crowd_tree
    path = plot_html(coords, meta, tmp_path / "crowd.html", title="10,000 fine-tunes", tree=tree)
    context = chromium.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    start = time.perf_counter()
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector(f"#modelvec-search[data-ready='{N_CROWD}']", timeout=60_000)  # drawn, models indexed
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n[maps] the map of {N_CROWD} models (with their tree) opened in headless Chromium in {seconds:.2f} s")
    assert seconds < 30  # a safety bound; the target (5 s) is measured, not asserted, here
    assert page.locator(".scatterlayer .point").count() == 0 and page.locator(".gl-container canvas").count() >= 1
    assert [url for url in requests if not url.startswith(("file:", "data:", "blob:", "about:"))] == []
    page.screenshot(path=str(tmp_path / "crowd.png"))
    rgb = imread(tmp_path / "crowd.png")[..., :3]
    assert (np.ptp(rgb, axis=-1) > 0.15).sum() > 20_000  # WebGL drew the coloured points

    row = meta.iloc[picked[0]]  # the most isolated labelled model: nothing else under the mouse when it is hovered
    name = row["model"]
    page.fill(SEARCH, name.split("/")[1].upper())  # part of the id, in another case
    page.wait_for_function(STATUS_IS, arg=[f"1 model matches: {name}"], timeout=10_000)
    assert page.evaluate(MARKED) == [True, 1, [name]]  # ringed, and an arrow names it
    x, y = page.evaluate(POSITION_JS, name)
    page.mouse.move(5, 5)
    page.mouse.move(x, y)
    page.wait_for_function(
        "([name]) => (document.querySelector('.hovertext') || {}).textContent?.includes(name)",
        arg=[name],
        timeout=10_000,
    )
    hover = page.locator(".hovertext").first.text_content()
    assert f"datasets: {row['datasets'][0]}" in hover
    assert "kind: fine-tune (confidence 0.90)" in hover and "children: 4 (" in hover  # the tree, on hover
    page.screenshot(path=str(tmp_path / "crowd-found.png"))  # for a person to look at

    many = int(meta["model"].str.startswith("org13/").sum())
    page.fill(SEARCH, "org13/")
    page.wait_for_function(
        "([start]) => document.getElementById('modelvec-search-status').textContent.startsWith(start)",
        arg=[f"{many} models match; 1 of {many}: org13/ft-00013 (Enter: next)"],  # in order of id
        timeout=10_000,
    )
    visible, ringed, first = page.evaluate(MARKED)
    assert visible and ringed == many and first == ["org13/ft-00013"]
    page.press(SEARCH, "Enter")  # the next match
    page.wait_for_function(
        "([start]) => document.getElementById('modelvec-search-status').textContent.startsWith(start)",
        arg=[f"{many} models match; 2 of {many}: org13/ft-00050"],
        timeout=10_000,
    )
    assert page.evaluate(MARKED)[2] == ["org13/ft-00050"]
    page.fill(SEARCH, "no-such-model")
    page.wait_for_function(STATUS_IS, arg=["no model matches \u201cno-such-model\u201d"], timeout=10_000)
    assert page.evaluate(MARKED) == [True, 0, []]
    context.close()


def test_browser_search_writes_untrusted_names_as_text_and_survives_a_change_of_colouring(chromium, picture, tmp_path):
    coords, meta = picture
    meta = meta.copy()
    hostile = 'evil/<img src=x onerror="window.pwned=1">&lt;b&gt;'
    meta.loc[3, "model"] = hostile
    path = plot_html(coords, meta, tmp_path / "map.html")
    context = chromium.new_context(viewport={"width": 1200, "height": 820}, offline=True)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector(f"#modelvec-search[data-ready='{len(meta)}']", timeout=15_000)
    page.fill(SEARCH, "&lt;b")  # the name's own characters, not their escapes
    page.wait_for_function(STATUS_IS, arg=[f"1 model matches: {hostile}"], timeout=5_000)
    assert page.evaluate(MARKED) == [True, 1, [hostile]]
    assert page.evaluate("() => [window.pwned, document.querySelectorAll('img').length]") == [None, 0]
    assert dialogs == []

    page.locator(".updatemenu-button", has_text="colour by author").click()
    page.wait_for_function(
        "() => document.querySelector('.legend .legendtitletext')?.textContent === 'author'", timeout=5_000
    )
    page.fill(SEARCH, "MODEL-1")  # model-1 and model-10 ... model-19
    first = min(m for m in meta["model"] if "model-1" in m)  # in order of id: org0/model-12
    page.wait_for_function(STATUS_IS, arg=[f"11 models match; 1 of 11: {first} (Enter: next)"], timeout=5_000)
    assert page.evaluate(MARKED)[:2] == [True, 11]
    assert page.locator(".scatterlayer .point").count() == len(meta) + 11  # every model, and the 11 rings
    page.fill(SEARCH, "")
    page.wait_for_function(STATUS_IS, arg=[""], timeout=5_000)
    assert page.evaluate(MARKED) == [True, 0, []]
    context.close()


# --- the model tree on the HTML map: kinds, hover, the edges of one model ------------------------------------------

BASE = "org/base"
HOSTILE = 'evil/<img src=x onerror="window.pwned=1">&lt;b&gt;'


def picture_tree(meta: pd.DataFrame) -> Tree:
    """A tree of ``picture``'s models, one of each kind: 0 a fine-tune of the base (the parent of 1, 4, 7 and 9 to
    28), 1 of 0, 2 a merge of 0 and 1, 3 an adapter on 1, 4 a quantization of 0, 5 unrelated, 6 a copy of the base, 7
    untraced (its card names 0), 8 a fine-tune of the base whose card names 5; the last model is not in the tree."""
    m = list(meta["model"])

    def node(i: int, kind: str, parents: list[str], confidence: float = 0.9, **more) -> Node:
        return Node(
            model=m[i],
            kind=kind,
            parent=parents[0] if parents else None,
            parents=parents,
            confidence=confidence,
            **more,
        )

    declared = dict(declared_relation="finetune", declared_parents=[BASE])
    nodes = [
        node(0, "fine-tune", [BASE], **declared),
        node(1, "fine-tune", [m[0]], 0.8),
        node(
            2, "merge", [m[0], m[1]], 0.7, weights=[0.6, 0.4], declared_relation="merge", declared_parents=[m[0], m[1]]
        ),
        node(3, "adapter", [m[1]], 1.0),
        node(4, "quantization", [m[0]], 0.95),
        node(5, "unrelated", [], 0.99),
        node(6, "copy", [BASE], 1.0, copy_of=BASE),
        node(7, "untraced", [m[0]], 0.0, declared_parents=[m[0]], note="no trace stored"),
        node(8, "fine-tune", [BASE], 0.6, declared_relation="finetune", declared_parents=[m[5]], agrees=False),
        *(node(i, "fine-tune", [m[0]]) for i in range(9, len(m) - 1)),
    ]
    return Tree(BASE, nodes)


def edges_of(tree: Tree, meta: pd.DataFrame, model: str) -> tuple[list[int], list[int]]:
    """The rows of a model's parents and children on the map, as the page orders them (children by row)."""
    row = {m: i for i, m in enumerate(meta["model"])}
    node = tree.by_model()[model]
    children = [row[n.model] for n in tree.nodes if model in n.parents and n.model in row]
    return [row[p] for p in node.parents if p in row], sorted(children)


def lines(coords: np.ndarray, model: int, rows: list[int]) -> list[list]:
    """The x and the y of the lines from a model to ``rows``, as a plotly trace holds them (None between): the page
    carries the coordinates as float64, so they come back exactly."""
    return [[v for r in rows for v in (float(coords[model, k]), float(coords[r, k]), None)] for k in (0, 1)]


def test_html_colours_by_kind_and_hovers_the_tree_where_it_is_known(picture, tmp_path):
    coords, meta = picture
    meta = meta.copy()
    meta.loc[1, "model"] = HOSTILE  # a parent of the merge and of the adapter
    tree = picture_tree(meta)
    data, layout = plotted(plot_html(coords, meta, tmp_path / "tree.html", tree=tree).read_text(encoding="utf-8"))
    menus = layout["updatemenus"]
    buttons = {b["label"]: b for b in menus[0]["buttons"]}
    assert list(buttons) == [f"colour by {c}" for c in ("dataset", "author", "label source", "kind")]
    visible, legend_title, indices = buttons["colour by kind"]["args"]
    assert legend_title == {"legend.title.text": "kind (from the weights)"}
    shown = [data[i] for i, v in zip(indices, visible["visible"]) if v and data[i]["name"] != "search"]
    kinds = {n.model: n.kind for n in tree.nodes}
    for trace in shown:  # each kind in the tree figure's colour, holding exactly the models of that kind
        names = [html.unescape(row[0]) for row in trace["customdata"]]
        kind, count = re.fullmatch(r"(.+) \((\d+)\)", trace["name"]).groups()
        assert int(count) == len(names)
        if kind == "not in the tree":
            assert names == [meta["model"].iloc[-1]] and trace["marker"]["color"] == UNLABELLED_COLOR
        else:
            assert trace["marker"]["color"] == KIND_COLOURS[kind] and {kinds[n] for n in names} == {kind}
    assert sum(len(t["customdata"]) for t in shown) == len(meta) and len(shown) == 8  # 7 kinds, and the rest

    hover = {  # the tree's lines of each model's hover, as plotly fills the template
        html.unescape(row[0]): re.sub(r"%\{customdata\[(\d)\]\}", lambda g: str(row[int(g[1])]), t["hovertemplate"])
        .split("<extra>")[0]
        .split("<br>author: ")[1]
        .partition("<br>")[2]
        for t in data
        if t.get("visible") is True and "customdata" in t
        for row in t["customdata"]
    }
    m = list(meta["model"])
    assert hover[m[2]] == (
        "kind: merge (confidence 0.70)"
        f"<br>parents: {m[0]} (0.60), {html.escape(HOSTILE, quote=False)} (0.40)"
        "<br>children: none"
        f"<br>card: merge of {m[0]}, {html.escape(HOSTILE, quote=False)} — the weights agree"
    )
    children = sorted(m[i] for i in (1, 2, 4, 7, *range(9, len(m) - 1)))
    assert (
        f"<br>children: {len(children)} ({', '.join(html.escape(c, quote=False) for c in children[:3])}, …)"
        in hover[m[0]]
    )
    assert "<br>parent: the base<br>" in hover[m[0]] and hover[m[0]].endswith(
        "card: fine-tune of the base — the weights agree"
    )
    assert hover[m[8]].endswith(f"card: fine-tune of {m[5]} — ⚠ the weights disagree")
    assert "parent: none (unrelated weights)" in hover[m[5]] and "card: declares no parent" in hover[m[5]]
    assert hover[m[6]].startswith("kind: copy (confidence 1.00), a copy of the base<br>parent: the base")
    assert hover[m[7]].startswith("kind: untraced<br>parent: ") and "card: derived from" in hover[m[7]]
    assert hover[m[-1]] == "kind: not in the model tree<br>parent: —<br>children: —<br>card: —"
    assert all("<img" not in h and "<b>" not in h for h in hover.values())  # names are text; markup, the template's
    assert all(len(row) == 9 and row[4] == m.index(html.unescape(row[0])) for t in shown for row in t["customdata"])

    # a small map keeps the toggle of every edge: one line per parent on the map (the base is not on it)
    assert [b["label"] for b in menus[1]["buttons"]] == ["tree edges off", "tree edges on"]
    (every,) = [t for t in data if t.get("name") == "model tree"]
    assert every["visible"] is False and every["x"].count(None) == sum(len(edges_of(tree, meta, n)[0]) for n in m[:-1])
    picked = [t for t in data if t.get("name") in ("parent edges", "child edges")]
    assert len(picked) == 2 and all(len(t["x"]) == 0 for t in picked)  # drawn by the page, one model at a time

    plain, plain_layout = plotted(plot_html(coords, meta, tmp_path / "plain.html").read_text(encoding="utf-8"))
    assert len(plain_layout["updatemenus"]) == 1 and len(plain_layout["updatemenus"][0]["buttons"]) == 3
    assert not [t for t in plain if "edges" in t.get("name", "") or t.get("name") == "model tree"]
    assert all(len(row) == 5 for t in plain if "customdata" in t for row in t["customdata"])  # no tree lines


@pytest.fixture(scope="module")
def crowd_tree(crowd) -> tuple[Tree, tuple[int, int]]:
    """A made-up tree of the crowd (each model under the base or an earlier model; adapters, quantizations, merges,
    unrelated weights and copies among them) and its two most isolated labelled models, easy to point at: the first
    a fine-tune of one model with 4 children, the second a merge of two with 2 children."""
    from sklearn.neighbors import NearestNeighbors

    coords, meta = crowd
    m = list(meta["model"])
    labelled = np.array([bool(d) for d in meta["datasets"]])
    distance = NearestNeighbors(n_neighbors=2).fit(coords).kneighbors(coords)[0][:, 1]
    a, b = (int(i) for i in np.argsort(-np.where(labelled, distance, -1.0))[:2])
    rng = np.random.default_rng(11)
    others = [i for i in rng.permutation(N_CROWD) if i not in (a, b)]
    forced = {
        a: [others[0]],
        b: [others[1], others[2]],
        **{c: [a] for c in others[3:7]},
        **{c: [b] for c in others[7:9]},
    }
    kinds = {0: "adapter", 1: "quantization", 2: "merge", 3: "unrelated", 4: "copy"}
    nodes = []
    for i in range(N_CROWD):
        if i in forced:
            up, kind = [m[j] for j in forced[i]], "merge" if i == b else "fine-tune"
        else:
            kind = kinds.get(i % 53, "fine-tune")
            pool = [j for j in rng.integers(0, max(i, 1), size=2) if j not in (a, b) and j < i]
            up = [BASE] if i < 100 or not pool else [m[j] for j in pool[: 2 if kind == "merge" else 1]]
            up = [] if kind == "unrelated" else [BASE] if kind == "copy" else up
            kind = "fine-tune" if kind == "merge" and len(up) < 2 else kind
        weights = [0.7, 0.3] if kind == "merge" else None
        nodes.append(
            Node(model=m[i], kind=kind, parent=up[0] if up else None, parents=up, confidence=0.9, weights=weights)
        )
    return Tree(BASE, nodes), (a, b)


EDGES = """() => {
  const gd = document.getElementById('modelvec-map');
  const trace = (name) => gd.data.find((t) => t.name === name);
  const status = document.getElementById('modelvec-tree-status');
  return [[Array.from(trace('parent edges').x), Array.from(trace('parent edges').y)],
          [Array.from(trace('child edges').x), Array.from(trace('child edges').y)], status.textContent];
}"""


def drawn(page) -> tuple[list, list, str]:
    """The lines drawn from the picked model to its parents and to its children (x, y each), and the line naming it."""
    return tuple(page.evaluate(EDGES))


def test_browser_draws_the_edges_of_the_model_clicked_or_found_at_10000_models(
    chromium, crowd, crowd_tree, tmp_path, capsys
):
    coords, meta = crowd
    tree, (a, b) = crowd_tree
    path = plot_html(coords, meta, tmp_path / "crowd-tree.html", title="10,000 fine-tunes", tree=tree)
    page_text = path.read_text(encoding="utf-8")
    _, layout = plotted(page_text)
    assert len(layout["updatemenus"]) == 1 and N_CROWD > ALL_EDGES_UP_TO  # no toggle of every edge: a tangle
    context = chromium.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    page = context.new_page()
    start = time.perf_counter()
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector(f"#modelvec-search[data-ready='{N_CROWD}']", timeout=60_000)
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n[maps] the map of {N_CROWD} models and their tree opened in headless Chromium in {seconds:.2f} s")
    assert seconds < 30
    assert drawn(page) == ([[], []], [[], []], "")  # nothing until a model is picked

    def expect(model: int, *, timeout: int = 10_000) -> None:
        up, down = edges_of(tree, meta, meta["model"][model])
        page.wait_for_function(
            "([row]) => document.getElementById('modelvec-tree-status').getAttribute('data-row') === row",
            arg=[str(model)],
            timeout=timeout,
        )
        parents, children, status = drawn(page)
        assert parents == lines(coords, model, up) and children == lines(coords, model, down)
        kin = f"{len(up)} parent{'s' * (len(up) != 1)} (dark) and {len(down)} child{'ren' * (len(down) != 1)} (light)"
        assert status == f"edges of {meta['model'][model]}: {kin} on the map"

    for model, n_up, n_down in ((a, 1, 4), (b, 2, 2), (a, 1, 4)):  # each click replaces the edges drawn before
        assert tuple(map(len, edges_of(tree, meta, meta["model"][model]))) == (n_up, n_down)
        x, y = page.evaluate(POSITION_JS, meta["model"][model])
        page.mouse.move(5, 5)
        page.mouse.click(x, y)
        expect(model)
    page.screenshot(path=str(tmp_path / "crowd-edges.png"))  # for a person to look at

    page.fill(SEARCH, meta["model"][b])  # found by name: its edges replace the clicked model's
    expect(b)
    page.fill(SEARCH, "no-such-model")
    page.wait_for_function(STATUS_IS, arg=["no model matches \u201cno-such-model\u201d"], timeout=10_000)
    assert drawn(page) == ([[], []], [[], []], "")
    context.close()


def test_browser_hovers_and_clicks_the_tree_of_untrusted_names_as_text(chromium, picture, tmp_path):
    coords, meta = picture
    meta = meta.copy()
    meta.loc[1, "model"] = HOSTILE
    tree = picture_tree(meta)
    path = plot_html(coords, meta, tmp_path / "tree.html", tree=tree)
    context = chromium.new_context(viewport={"width": 1200, "height": 820}, offline=True)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector(f"#modelvec-search[data-ready='{len(meta)}']", timeout=15_000)
    m = list(meta["model"])
    x, y = page.evaluate(POSITION_JS, m[2])  # the merge of 0 and the hostile 1
    page.mouse.move(5, 5)
    page.mouse.move(x, y)
    label = page.wait_for_selector(".hovertext", timeout=5_000)
    text = label.text_content()
    assert "kind: merge (confidence 0.70)" in text and f"parents: {m[0]} (0.60), {HOSTILE} (0.40)" in text
    assert "children: none" in text and "the weights agree" in text
    page.mouse.click(x, y)
    page.wait_for_function("() => document.getElementById('modelvec-tree-status').getAttribute('data-row') === '2'")
    parents, children, status = drawn(page)
    assert parents == lines(coords, 2, [0, 1]) and children == [[], []]
    assert status == f"edges of {m[2]}: 2 parents (dark) and 0 children (light) on the map"
    x, y = page.evaluate(POSITION_JS, m[8])  # its card names 5: the weights disagree
    page.mouse.move(5, 5)
    page.mouse.move(x, y)
    page.wait_for_function(
        "() => (document.querySelector('.hovertext') || {}).textContent?.includes('the weights disagree')",
        timeout=5_000,
    )
    assert page.evaluate("() => [window.pwned, document.querySelectorAll('img').length]") == [None, 0]
    assert dialogs == []

    page.locator(".updatemenu-button", has_text="colour by kind").click()
    page.wait_for_function(
        "() => document.querySelector('.legend .legendtitletext')?.textContent === 'kind (from the weights)'",
        timeout=5_000,
    )
    legend = sorted(t.strip() for t in page.locator(".legend .traces").all_text_contents())
    assert legend == sorted(
        [
            "fine-tune (23)",
            "adapter (1)",
            "merge (1)",
            "quantization (1)",
            "unrelated (1)",
            "copy (1)",
            "untraced (1)",
            "not in the tree (1)",
        ]
    )
    assert page.locator(".scatterlayer .point").count() == len(meta)
    page.locator(".updatemenu-button", has_text="tree edges on").click()  # a small map: every edge at once
    page.wait_for_function(
        "() => document.getElementById('modelvec-map')._fullData.find((t) => t.name === 'model tree').visible === true"
    )
    context.close()


# --- the rank study's figure: a law drawn only where it fits -------------------------------------------------------


def _ranks(families: dict[str, np.ndarray]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"stack": "encoder", "layer": layer, "family": family, "shape": "64x64", "threshold": 0.9, "rank": r}
            for family, ranks in families.items()
            for layer, r in enumerate(ranks)
        ]
    )


def _dashed(fig) -> dict[str, np.ndarray]:
    """The laws drawn: label -> y of each dashed line."""
    return {
        line.get_label(): np.asarray(line.get_ydata())
        for ax in fig.axes
        for line in ax.lines
        if line.get_linestyle() == "--"
    }


def test_rank_figure_draws_a_law_only_where_its_adjusted_r2_reaches_the_threshold(tmp_path):
    from modelvec.analyse.laws import MIN_ADJ_R2, shown_law
    from modelvec.plots.depth import plot_rank, rank_figure
    from modelvec.spectra.tables import fit_depth_laws

    x = np.arange(1, 13)
    rng = np.random.default_rng(3)
    table = _ranks({"q": 10 + 2 * x, "k": 30 + np.round(rng.normal(0, 8, 12))})  # a line, and noise
    fits = fit_depth_laws(table)
    noise = fits[("encoder", "k", 0.9)]
    assert max(f.adj_r2 for f in noise if f.adj_r2 == f.adj_r2) < 0  # a negative adjusted R²: no law
    fig = rank_figure(table, fits, 0.9, title="m")
    drawn = _dashed(fig)
    assert set(drawn) == {"_law q"}
    law = shown_law(fits[("encoder", "q", 0.9)])[0]
    np.testing.assert_allclose(drawn["_law q"], law.predict(np.linspace(1, 12, 200)))  # the law shown, drawn
    legend = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert any(t.startswith("query Wq — ") and "adj. R²" in t for t in legend)
    assert "key Wk" in legend  # no law named beside the noise
    caption = " ".join(fig._suptitle.get_text().split())
    assert f"drawn only where its adjusted R² ≥ {MIN_ADJ_R2:g}" in caption
    # a stricter threshold than the line's own adjusted R² (1.0 less rounding): nothing drawn, and said
    strict = rank_figure(table, fits, 0.9, min_adj_r2=1.0 + 1e-9)
    assert _dashed(strict) == {} and "no law drawn" in strict._suptitle.get_text()
    path = plot_rank(table, fits, 0.9, tmp_path / "r.png", title="m")
    assert imread(path).shape[2] in (3, 4)


def test_rank_figure_never_draws_a_nan_law_nor_one_for_two_layers():
    from modelvec.analyse.laws import Fit
    from modelvec.plots.depth import rank_figure
    from modelvec.spectra.tables import fit_depth_laws

    two = _ranks({"q": np.array([6, 6]), "k": np.array([6, 7])})
    fig = rank_figure(two, fit_depth_laws(two), 0.9)
    assert _dashed(fig) == {}
    assert "too few layers" in fig._suptitle.get_text()
    assert all("adj." not in t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts())
    table = _ranks({"q": np.arange(1, 13)})
    nan_law = Fit(
        name="linear",
        coefficients={"a": 0.0, "b": 1.0},
        equation="r(x) = 1·x",
        r2=math.nan,
        adj_r2=math.nan,
        aic=-10.0,
        n=12,
        k=2,
    )
    assert _dashed(rank_figure(table, {("encoder", "q", 0.9): [nan_law]}, 0.9)) == {}
