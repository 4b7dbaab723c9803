"""Pictures: maps of the vectors (PNG and self-contained HTML) and the depth study's figure."""

from .depth import FAMILY_NAMES, FAMILY_ORDER, plot_rank
from .maps import COLOR_BY, PALETTE, Grouping, grouping, map_figure, plot_html, plot_png

__all__ = [
    "COLOR_BY",
    "FAMILY_NAMES",
    "FAMILY_ORDER",
    "PALETTE",
    "Grouping",
    "grouping",
    "map_figure",
    "plot_html",
    "plot_png",
    "plot_rank",
]
