"""Pictures of a map: a PNG for papers and notes, a self-contained HTML page to explore.

Both take ``coords`` (n, 2), e.g. from :func:`modelvec.analyse.reduction.reduce`, and ``meta``, a
:class:`pandas.DataFrame` with one row per model, in the same order, and the columns

- ``model`` (str): the model id,
- ``datasets`` (list of str; empty, None or NaN = unlabelled; a single string counts as one),
- ``label_source`` (str or None; e.g. ``"card"``) and ``author`` (str or None); either may be
  missing, which is the same as None everywhere.

Colours (the same in both pictures, see :func:`grouping`):

- One colour per group (dataset, author or label source), the largest group first. A model
  with several datasets is coloured by its first one (the order its card lists them); the
  hover text of the HTML page shows all of them, and the PNG's legend title says
  "first listed" when it happens.
- The palette is tab10 followed by the light half of tab20, both without their greys: 18
  distinct colours. Grey is kept for models without a value ("unlabelled": faint light grey,
  small, drawn behind the rest) and, when there are more than 18 groups, for the smallest
  groups lumped together as "k other datasets" (dark grey).

Many models (thousands of fine-tunes of one base) stay readable: from :data:`DENSE_FROM` models the PNG
shades the map by how many models lie in each hexagon, under small translucent points (so piles of points
read as density, not as one blob); from :data:`WEBGL_FROM` the HTML page draws with WebGL. The page has a
search box that finds a model by part of its id, whatever the map's size. Given the model tree, the page also
colours by kind, shows each model's place in the tree on hover, and draws the edges of the model clicked or found
(every edge at once only up to :data:`ALL_EDGES_UP_TO` models: beyond, they are a tangle).

Both writers create the parent folders, write to a temporary file beside the target and rename
it into place (so a reader never sees half a file), and return the path.
"""

from .groups import COLOR_BY, PALETTE, Grouping, grouping
from .interactive import plot_html
from .png import map_figure, plot_png

__all__ = ["COLOR_BY", "PALETTE", "Grouping", "grouping", "map_figure", "plot_html", "plot_png"]
