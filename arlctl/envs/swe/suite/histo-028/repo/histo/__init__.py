"""histo: fixed-width histograms."""

from histo.binning import bin_index
from histo.hist import histogram

__all__ = ["histogram", "bin_index"]
