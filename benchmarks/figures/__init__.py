"""The README's and docs' pictures, made from real CPU runs by one command:

    python -m benchmarks.figures              # trains what is missing under runs/figures, then draws
    python -m benchmarks.figures --draw-only  # draws from the cached runs, trains nothing

``runs.py`` trains (once) the runs the pictures show and caches them under ``runs/figures``;
``draw.py`` holds the drawing helpers; ``pictures.py`` draws the five pictures into ``docs/images``.
"""
