"""Detection models; ``from models import Detector`` is the Python inference API (models/detector.py).

The API is imported on first use, so ``import models.yolo`` stays light.
"""


def __getattr__(name):
    if name in ("Detector", "Detections"):
        from models import detector

        return getattr(detector, name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
