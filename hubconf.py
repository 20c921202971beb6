"""PyTorch Hub entry points, as in YOLOv5:

    detector = torch.hub.load("path/to/this/repo", "custom", path="best.pt", source="local")
    detector.conf = 0.5                     # options as attributes, as on YOLOv5's hub model
    result = detector("image.jpg")          # Detections: boxes, scores, classes (original pixels)

``path`` may be a .pt checkpoint, or an .onnx / .torchscript file or *_openvino_model folder written by
export.py. Pretrained weights are not downloaded: train your own (train.py) or convert one
(utils/foreign_checkpoint.py). The model names build an untrained model, as YOLOv5's ``pretrained=False``:

    model = torch.hub.load("path/to/this/repo", "ffca_yolo_n", source="local", pretrained=False, classes=5)
"""

import os

dependencies = ["torch", "numpy", "cv2", "yaml"]
_MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")  # no Path: hub lists every callable


def custom(path="best.pt", device="", **options):
    """A :class:`models.detector.Detector` for ``path``; ``options`` are its keyword arguments
    (``imgsz``, ``conf``, ``iou``, ``max_det``, ``classes``, ``agnostic``, ``half``)."""
    from models.detector import Detector

    return Detector(path, device=device, **options)


def _untrained_model(yaml_name: str):
    """The hub entry point for ``models/<yaml_name>.yaml``: an untrained ``DetectionModel``."""

    def entry(pretrained=True, channels=3, classes=80, device=""):
        from models.yolo import Model
        from utils.errors import UserError
        from utils.torch_utils import select_device

        if pretrained:
            raise UserError(f"{entry.__name__}: no pretrained weights are downloaded here; pass pretrained=False "
                            "for an untrained model, or load your own checkpoint with custom(path='best.pt')")
        for name, value in (("classes", classes), ("channels", channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{entry.__name__}: {name}={value!r}: give a positive int")
        return Model(os.path.join(_MODELS, f"{yaml_name}.yaml"), ch=channels, nc=classes).to(select_device(device))

    entry.__name__ = entry.__qualname__ = yaml_name.replace("-", "_")
    entry.__doc__ = (f"An untrained {yaml_name} (models/{yaml_name}.yaml) with ``classes`` classes and "
                     f"``channels`` input channels: YOLOv5's ``torch.hub.load(..., pretrained=False)``.")
    return entry


yolov5n, yolov5s, yolov5m, yolov5l, yolov5x = map(_untrained_model, ("yolov5n", "yolov5s", "yolov5m", "yolov5l",
                                                                    "yolov5x"))
ffca_yolo, ffca_yolo_n, l_ffca_yolo = map(_untrained_model, ("ffca-yolo", "ffca-yolo-n", "l-ffca-yolo"))
