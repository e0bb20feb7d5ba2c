"""Descriptive statistics on plain lists."""

from statskit.central import mean, median, mode, weighted_mean
from statskit.spread import histogram, percentile, stdev, value_range, variance, zscores

__all__ = [
    "histogram",
    "mean",
    "median",
    "mode",
    "percentile",
    "stdev",
    "value_range",
    "variance",
    "weighted_mean",
    "zscores",
]
