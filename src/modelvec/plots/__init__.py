"""Pictures: maps of the vectors (PNG and self-contained HTML) and the rank study's figure."""

from .maps import COLOR_BY, PALETTE, Grouping, grouping, plot_html, plot_png
from .rank import FAMILY_NAMES, FAMILY_ORDER, plot_rank

__all__ = [
    "COLOR_BY",
    "FAMILY_NAMES",
    "FAMILY_ORDER",
    "PALETTE",
    "Grouping",
    "grouping",
    "plot_html",
    "plot_png",
    "plot_rank",
]
