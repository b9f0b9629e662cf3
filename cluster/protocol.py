"""Transitional: the native protocol moved to cluster/native/ (removed once bench/ follows)."""

from cluster.native import *  # noqa: F403
