"""What each val.run call detected, per image: to compare training's validations with val.py's bit for bit."""

import contextlib
from dataclasses import dataclass, field

import pytest

import val


@dataclass
class Validation:
    """One val.run call: ``{image path: (n, 6) detections in letterboxed pixels}`` and its ValResult."""

    detections: dict = field(default_factory=dict)
    result: object = None


@contextlib.contextmanager
def recorded_validations():
    """Yield a list that gets a :class:`Validation` for every ``val.run`` call inside the block, training's too."""
    calls = []
    run, add_batch = val.run, val.ValidationRecord.add_batch

    def recording_run(*args, **kwargs):
        calls.append(Validation())
        calls[-1].result = run(*args, **kwargs)
        return calls[-1].result

    def recording_add_batch(self, preds, targets, letterbox_shape, paths, shapes):
        calls[-1].detections.update({str(path): pred.detach().clone() for path, pred in zip(paths, preds)})
        return add_batch(self, preds, targets, letterbox_shape, paths, shapes)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(val, "run", recording_run)
        patch.setattr(val.ValidationRecord, "add_batch", recording_add_batch)
        yield calls
