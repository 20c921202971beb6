"""Data: data set config, label and image caches, image I/O, sampling, sources and data set stats."""
