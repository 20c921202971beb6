"""Routes from torchvision's operators to twins with the public ``torchvision.ops`` signatures.

The router sees torchvision's operators, not its Python functions: ``torchvision.ops.roi_align``,
``RoIAlign``, ``deform_conv2d``, ``DeformConv2d``, ``roi_pool`` and ``RoIPool`` all call
``torch.ops.torchvision.<name>`` with the operator's own arguments (boxes already as ``(K, 5)`` rois,
sizes split into height and width, groups counted). Each function here returns routes for
:class:`utils.determinism.twins.registry.Twin` that translate those arguments back to the public
signature of a twin, or no routes when torchvision's operators are not loaded.
"""


import torch

from utils.errors import UserError
from utils.torchvision_ops import operators


def torchvision_operator(name: str):
    """``torch.ops.torchvision.<name>`` (torchvision's library loaded), or None when torchvision or the
    operator is missing."""
    try:
        return getattr(operators(), name)
    except (AttributeError, RuntimeError, UserError):
        return None


def _routes(name: str, adapter) -> tuple:
    operator = torchvision_operator(name)
    return () if operator is None else ((operator, adapter), (operator.default, adapter))


def _roi_align_adapter(twin):
    """The operator's arguments ``(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
    aligned)`` to ``twin(input, boxes, output_size, spatial_scale, sampling_ratio, aligned)``."""
    def adapter(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        return twin(input, rois, (pooled_height, pooled_width), spatial_scale, sampling_ratio, aligned)
    return adapter


def roi_align_routes(twin) -> tuple:
    """``twin(input, boxes, output_size, spatial_scale, sampling_ratio, aligned)`` for ``torchvision::roi_align``."""
    return _routes("roi_align", _roi_align_adapter(twin))


def roi_align_patches(twin) -> tuple:
    """``(("torchvision.ops.roi_align", "_roi_align", adapter),)``: on CUDA (and MPS, XPU) under
    ``use_deterministic_algorithms(True)``, ``torchvision.ops.roi_align`` and ``RoIAlign`` do not call the
    operator: they run the module function ``_roi_align`` (torchvision's pure-PyTorch version, compiled with
    ``torch.compile`` on its first call), with the operator's arguments. A TorchFunctionMode does not see a
    Python function, so while routing that module attribute is the twin (when the module is imported)."""
    return (("torchvision.ops.roi_align", "_roi_align", _roi_align_adapter(twin)),)


def roi_pool_routes(twin) -> tuple:
    """``twin(input, boxes, output_size, spatial_scale)`` for ``torchvision::roi_pool``.

    The operator also returns the argmax of each bin, which ``torchvision.ops.roi_pool`` discards; the
    twin computes none, so the route returns -1 there (a caller reading it gets an obvious non-index).
    """
    def adapter(input, rois, spatial_scale, pooled_height, pooled_width):
        output = twin(input, rois, (pooled_height, pooled_width), spatial_scale)
        return output, torch.full(output.shape, -1, dtype=torch.int32, device=output.device)
    return _routes("roi_pool", adapter)


def deform_conv2d_routes(twin) -> tuple:
    """``twin(input, offset, weight, bias, stride, padding, dilation, mask)`` for ``torchvision::deform_conv2d``
    (the groups follow from the shapes, as in ``torchvision.ops.deform_conv2d``)."""
    def adapter(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                groups, offset_groups, use_mask):
        return twin(input, offset, weight, bias, stride=(stride_h, stride_w), padding=(pad_h, pad_w),
                    dilation=(dilation_h, dilation_w), mask=mask if use_mask else None)
    return _routes("deform_conv2d", adapter)
