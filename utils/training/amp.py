"""Mixed precision: AMP is used on CUDA only, and only after it is shown to give fp32's detections."""

import torch

from utils.ddp import DistInfo, gather_objects
from utils.logging import LOGGER, colorstr


def amp_for_run(model, resume_ckpt=None, info: DistInfo = DistInfo()) -> bool:
    """AMP on or off, the same on every rank: :func:`check_amp` for a new run, the checkpoint's decision for a resume.

    Checking again on resumed weights could flip the decision, and with it the precision of every
    later step and the GradScaler state the checkpoint holds. Checkpoints from before the decision
    was stored tell it by their GradScaler state, which is empty when AMP was off.
    """
    if resume_ckpt is None:
        return checked_on_every_rank(model, info)
    stored = resume_ckpt.get("amp")
    amp = bool(resume_ckpt.get("scaler")) if stored is None else bool(stored)
    if amp and next(model.parameters()).device.type != "cuda":
        LOGGER.warning(f"{colorstr('AMP: ')}the checkpoint trained with AMP on CUDA; resuming in fp32 on this "
                       "device, so the run will not be bit-identical to an uninterrupted one")
        return False
    LOGGER.info(f"{colorstr('AMP: ')}{'on' if amp else 'off'}, as in the checkpoint")
    return amp


def checked_on_every_rank(model, info: DistInfo) -> bool:
    """AMP only if :func:`check_amp` passes on every rank.

    Ranks can disagree: GPUs of different models, or an output near the check's tolerance. A rank
    training in fp32 beside ranks under AMP would add unscaled gradients to loss-scaled ones in the
    reduction, and each rank's GradScaler would unscale the sum differently, so the replicas drift apart.
    """
    passed = gather_objects(check_amp(model), info)
    if info.is_main and not all(passed) and any(passed):
        failed = ", ".join(str(rank) for rank, ok in enumerate(passed) if not ok)
        LOGGER.warning(f"{colorstr('AMP: ')}the check failed on rank(s) {failed}; every rank trains in fp32")
    return all(passed)


def check_amp(model, imgsz: int = 256, atol: float = 0.1) -> bool:
    """Compare fp32 and autocast eval outputs of ``model`` on a fixed input; True if AMP is safe.

    Runs on the model's own device; returns False (AMP off) on CPU or when outputs diverge,
    which catches GPUs and drivers whose fp16 kernels are broken.
    """
    device = next(model.parameters()).device
    prefix = colorstr("AMP: ")
    if device.type != "cuda":
        return False
    generator = torch.Generator().manual_seed(0)
    im = torch.rand(1, 3, imgsz, imgsz, generator=generator).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            reference = model(im)[0].float()
            with torch.autocast("cuda"):
                mixed = model(im)[0].float()
        ok = reference.shape == mixed.shape and torch.allclose(reference[..., 4], mixed[..., 4], atol=atol)
    except Exception as e:  # a broken fp16 kernel raises here instead of returning wrong numbers
        LOGGER.warning(f"{prefix}check failed ({e}); training in fp32")
        ok = False
    finally:
        model.train(was_training)
    LOGGER.info(f"{prefix}{'checks passed' if ok else 'outputs differ from fp32; AMP disabled'}")
    return ok
