"""PyTorch Hub entry points, as in YOLOv5:

    detector = torch.hub.load("path/to/this/repo", "custom", path="best.pt", source="local")
    detector.conf = 0.5                     # options as attributes, as on YOLOv5's hub model
    result = detector("image.jpg")          # Detections: boxes, scores, classes (original pixels)

``path`` may be a .pt checkpoint, or an .onnx / .torchscript file or *_openvino_model folder written by
export.py. Pretrained weights are not downloaded: train your own (train.py) or convert one
(utils/convert_checkpoint.py).
"""

dependencies = ["torch", "numpy", "cv2", "yaml"]


def custom(path="best.pt", device="", **options):
    """A :class:`models.detector.Detector` for ``path``; ``options`` are its keyword arguments
    (``imgsz``, ``conf``, ``iou``, ``max_det``, ``classes``, ``agnostic``, ``half``)."""
    from models.detector import Detector

    return Detector(path, device=device, **options)
