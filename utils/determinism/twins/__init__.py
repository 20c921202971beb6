"""Deterministic twins: the same function as a native op, computed with deterministic CUDA kernels only.

``registry.py`` holds the table (:data:`TWINS`) and the router (:func:`routing`), ``pooling.py`` and
``interpolation.py`` the twins of adaptive pooling and of ``F.interpolate``, ``torchvision_routes.py``
the routes for twins of torchvision's operators. The determinism policy activates the twins that
resolve the audit's findings (``utils/determinism/audit_cache.py``) and routes the training forward
through them (``DeterminismPolicy.forward_scope``). See docs/determinism.md, "Deterministic twins".
"""

from utils.determinism.twins.registry import NATIVE, TWINS, Twin, TwinRouter, routing, same_signature, twin_named, \
    twins_resolving

__all__ = ("NATIVE", "TWINS", "Twin", "TwinRouter", "routing", "same_signature", "twin_named", "twins_resolving")
