"""Start a proof module as ``python -m`` does, once this interpreter has imported every module the proof needs.

    python3 -m benchmarks.gpu_proof.start MODULE [flags of MODULE]

``in_out_dir.sh`` (behind ``on_device.sh`` and ``multi_gpu.sh``) starts the proofs through it. An
image that lacks a module, or whose module cannot load (opencv without ``libGL``), stops here with
exit 2 and one line naming the module, not with a traceback minutes into the proof. The check
imports what the proof imports anyway, in the interpreter that then runs the proof, so it costs no
second start of torch. Importing torch does not start CUDA, so a proof that sets
``CUBLAS_WORKSPACE_CONFIG`` at its top still sets it before any CUDA work.
"""

import importlib
import runpy
import sys

# What the proofs and the train.py runs they start import, in the order the proofs import them.
NEEDED = ("torch", "torchvision", "numpy", "cv2", "yaml", "pandas", "matplotlib", "tqdm")
USAGE = "usage: python3 -m benchmarks.gpu_proof.start MODULE [flags of MODULE]"


def first_unimportable(names=NEEDED) -> str | None:
    """The line naming the first of ``names`` that cannot be imported, or None when every one imports."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # a broken install raises more than ImportError (OSError, AttributeError)
            reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            return (f"ERROR: the proof needs the module '{name}', which this Python cannot import ({reason}): "
                    f"install it, or run the proof in an image that has it")
    return None


def main(argv=None) -> int:
    """Check the imports, then run ``MODULE`` as ``__main__`` with the remaining arguments; its exit is ours."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    problem = first_unimportable()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    sys.argv = list(argv)  # run_module puts the module's file in sys.argv[0], as python -m does
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
