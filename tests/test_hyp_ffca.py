"""The FFCA-YOLO authors' hyp ships as a file equal to scratch-low except lrf."""

from pathlib import Path

import yaml

HYPS = Path(__file__).resolve().parents[1] / "data" / "hyps"


def test_ffca_paper_hyp_differs_from_scratch_low_only_in_lrf():
    paper = yaml.safe_load((HYPS / "hyp.ffca-paper.yaml").read_text())
    low = yaml.safe_load((HYPS / "hyp.scratch-low.yaml").read_text())
    assert paper.keys() == low.keys()
    assert {k for k in low if paper[k] != low[k]} == {"lrf"}
    assert paper["lrf"] == 0.2
