"""The FFCA-YOLO authors' hyp ships as a file equal to scratch-low except lrf and the objectness weights by level position."""

from pathlib import Path

import yaml

HYPS = Path(__file__).resolve().parents[1] / "data" / "hyps"


def test_ffca_paper_hyp_differs_from_scratch_low_only_in_lrf_and_balance():
    paper = yaml.safe_load((HYPS / "hyp.ffca-paper.yaml").read_text())
    low = yaml.safe_load((HYPS / "hyp.scratch-low.yaml").read_text())
    assert paper.keys() == low.keys()
    assert {k for k in low if paper[k] != low[k]} == {"lrf", "obj_balance_by_stride"}
    assert paper["obj_balance_by_stride"] == 0, "the authors' code weights objectness by level position"
    assert paper["lrf"] == 0.2
    assert paper["min_box_px"] == 2.0, "the authors trained with YOLOv5's box_candidates, wh_thr=2"
