"""Pictures of a map: a PNG for papers and notes, a self-contained HTML page to explore.

Both take ``coords`` (n, 2), e.g. from :func:`modelvec.analyse.reduction.reduce`, and ``meta``, a
:class:`pandas.DataFrame` with one row per model, in the same order, and the columns ``model`` (str: the model id),
``datasets`` (list of str; empty, None or NaN = unlabelled; a single string counts as one), ``label_source`` (str or
None; e.g. ``"card"``) and ``author`` (str or None); a missing column is None everywhere.

Colours, the same in both pictures (:func:`grouping`): one per group (dataset, author or label source), the largest
group first; a model with several datasets is coloured by its first one (the hover shows all; the PNG's legend
title says "first listed" when it happens). The palette is tab10 then the light half of tab20, without their greys:
18 colours. Grey is for models without a value ("unlabelled": faint, small, drawn behind) and, beyond 18 groups, for
the smallest lumped together as "k other datasets" (dark grey).

Thousands of models stay readable: from :data:`DENSE_FROM` models the PNG shades each hexagon by how many models lie
in it, under small translucent points; from :data:`WEBGL_FROM` the HTML page draws with WebGL. The page has a search
box that finds a model by part of its id. Given the model tree, it also colours by kind, shows each model's place in
the tree on hover, and draws the edges of the model clicked or found (every edge at once only up to
:data:`ALL_EDGES_UP_TO` models: beyond, they are a tangle).

Both writers create the parent folders, write to a temporary file beside the target and rename it into place (a
reader never sees half a file), and return the path.
"""

from .groups import COLOR_BY, PALETTE, Grouping, grouping
from .interactive import plot_html
from .png import map_figure, plot_png

__all__ = ["COLOR_BY", "PALETTE", "Grouping", "grouping", "map_figure", "plot_html", "plot_png"]
