"""Offline converters from common annotation formats to this project's YOLO data set layout.

One module per source format (``visdrone``, ``coco`` (also AI-TOD), ``vedai``, ``dota``, ``voc``), each with
``add_arguments(parser)`` and ``convert(opt)``; :mod:`utils.converters.writer` writes the result all or
nothing; :mod:`utils.converters.cli` is the command line (``python data/scripts/convert.py FORMAT ...``).
"""
