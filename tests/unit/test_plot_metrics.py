"""examples/ctr_dnn/plot_metrics.py: which lines of metrics.jsonl it draws, and (with the
`plot` extra installed) that it renders a PNG with the Agg backend."""
import importlib.util
import json
import os

import pytest

PLOT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn", "plot_metrics.py")


def _module():
    spec = importlib.util.spec_from_file_location("plot_metrics", PLOT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _epoch(i, auc):
    return {"epoch": i, "examples_per_sec": 1.0, "global_auc": auc, "loss": 0.5 - auc / 10, "examples": 10,
            "workers": 2, "final": True}


def test_the_per_epoch_lines_of_the_last_run_are_drawn():
    rows = [{"time": 1.0, "epoch": 0, "loss": 0.6, "auc": 0.5}, _epoch(0, 0.6), _epoch(1, 0.7),
            _epoch(0, 0.61), {"time": 2.0, "epoch": 1, "loss": 0.5, "auc": 0.6}, _epoch(1, 0.72), _epoch(2, 0.75)]
    epochs, later_run = _module().epoch_rows(rows)
    assert [(r["epoch"], r["global_auc"]) for r in epochs] == [(0, 0.61), (1, 0.72), (2, 0.75)] and later_run
    assert _module().epoch_rows(rows[:3]) == ([rows[1], rows[2]], False)


def test_it_writes_a_png_of_loss_and_auc_per_epoch(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason='the plot extra: pip install -e ".[plot]"')
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(_epoch(i, 0.6 + i / 20)) + "\n" for i in range(3)))
    _module().main([str(metrics), str(tmp_path / "curves.png")])
    data = (tmp_path / "curves.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(data[16:20], "big") == 1000 and int.from_bytes(data[20:24], "big") == 400  # 10x4 in
    assert capsys.readouterr().out == f"wrote {tmp_path / 'curves.png'}: 3 epochs\n"


def test_a_file_without_per_epoch_lines_is_refused_with_the_fix(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"time": 1.0, "epoch": 0, "loss": 0.6, "auc": 0.5}) + "\n")
    with pytest.raises(SystemExit) as info:
        _module().main([str(metrics), str(tmp_path / "x.png")])
    assert str(info.value) == (f"{metrics} has no per-epoch lines with global_auc and loss: train with this "
                               f"directory's train.py first")
