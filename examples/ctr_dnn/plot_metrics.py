"""Draws loss and AUC curves from a metrics.jsonl written by train.py to a PNG.

Usage: python plot_metrics.py output/metrics.jsonl curves.png   (needs matplotlib:
pip install -e ".[plot]")
"""
import json
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit("usage: python plot_metrics.py METRICS_JSONL OUT_PNG")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit('plot_metrics.py needs matplotlib: pip install -e ".[plot]"') from None
    rows = [json.loads(line) for line in open(argv[0]) if line.strip()]
    rows = [r for r in rows if "loss" in r and "auc" in r]
    if not rows:
        raise SystemExit(f"{argv[0]} has no loss/auc lines: train with train.py first")
    t = [r["time"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(t, [r["loss"] for r in rows])
    ax1.set(xlabel="seconds", ylabel="loss", title="training loss")
    ax2.plot(t, [r["auc"] for r in rows], color="tab:orange")
    ax2.set(xlabel="seconds", ylabel="AUC", title="training AUC")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=100)
    print(f"wrote {argv[1]}")


if __name__ == "__main__":
    main()
