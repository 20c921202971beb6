"""Throughput and overhead: training steps, the loader, val/detect, inference, ONNX, NMS, start-up, upstream."""
