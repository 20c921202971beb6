"""Batches a loader yields, epoch by epoch, for comparing loaders in tests."""


def epoch_batches(loader, epochs):
    """``[[(images, targets, paths), ...] per epoch]`` with tensors cloned, after ``loader.set_epoch(epoch)``."""
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append([(b[0].clone(), b[1].clone(), b[2]) for b in loader])
    return out
