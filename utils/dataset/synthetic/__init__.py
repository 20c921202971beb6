"""This project's synthetic small-object data sets, offline and deterministic by seed.

``shapes`` (drawn geometry, the embedded data set a YAML's ``generate: shapes`` builds), ``tiny_shapes``
(smaller images and objects), ``very_tiny`` (2-12 px objects at AI-TOD's scale) and ``glyphs`` (textured
stroke characters among distractors); ``build`` writes any of them in YOLO layout, atomically, and
``cli`` holds the flags their command lines (data/scripts/make_*.py) share.
"""
