"""The last lines of a training run: the weights, their mAP, and commands that run as printed."""

import shlex

from utils.training.next_steps import next_steps


def test_next_steps_name_the_weights_their_map_and_runnable_commands(tmp_path):
    weights = tmp_path / "my runs" / "best.pt"  # a space: the printed commands must still split right
    lines = next_steps(weights, "data/shapes.yaml", ["/data/val a", "/data/val b"], 256,
                       (0.5, 0.4, 0.1234, 0.0567, 0, 0, 0)).splitlines()
    assert "mAP50 0.123, mAP50-95 0.057" in lines[0]
    val_cmd = shlex.split(lines[1].removeprefix("Next:"))
    assert val_cmd == ["python", "val.py", "--weights", str(weights), "--data", "data/shapes.yaml", "--imgsz", "256"]
    detect_cmd = shlex.split(lines[2])
    assert detect_cmd[detect_cmd.index("--source") + 1] == "/data/val a"  # the first val folder of a list
    assert detect_cmd[detect_cmd.index("--weights") + 1] == str(weights)


def test_a_single_class_run_prints_the_val_line_that_reproduces_its_metrics():
    lines = next_steps("best.pt", "d.yaml", "val", 64, (0, 0, 0, 0), single_cls=True).splitlines()
    assert shlex.split(lines[1].removeprefix("Next:"))[-1] == "--single-cls"
    assert "--single-cls" not in next_steps("best.pt", "d.yaml", "val", 64, (0, 0, 0, 0)).splitlines()[1]


def test_a_run_with_its_own_blocks_prints_lines_that_load_them():
    lines = next_steps("best.pt", "d.yaml", "val", 64, (0, 0, 0, 0), modules=["my blocks.py", "b/att.py"]).splitlines()
    for line in lines[1:]:
        words = shlex.split(line.removeprefix("Next:"))
        files = [words[i + 1] for i, word in enumerate(words) if word == "--modules"]
        assert files == ["my blocks.py", "b/att.py"]
