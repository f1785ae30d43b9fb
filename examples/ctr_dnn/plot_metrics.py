"""Draws the loss and the global AUC per epoch from a metrics.jsonl written by train.py to a PNG.

Usage: python plot_metrics.py output/metrics.jsonl curves.png   (needs matplotlib:
pip install -e ".[plot]")

train.py appends one line per epoch holding the job's figures (``global_auc``: the AUC
of every worker's training predictions of the epoch together; ``loss``: the mean over
workers of each one's last batch loss). When the file holds several runs (train.py
appends), the last run is drawn.
"""
import json
import sys


def epoch_rows(rows):
    """The per-epoch lines of the last run in ``rows`` (a run starts again at a lower or
    equal epoch number)."""
    epochs = [r for r in rows if r.get("final") and "global_auc" in r and "loss" in r]
    start = 0
    for i in range(1, len(epochs)):
        if epochs[i]["epoch"] <= epochs[i - 1]["epoch"]:
            start = i
    return epochs[start:], start > 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit("usage: python plot_metrics.py METRICS_JSONL OUT_PNG")
    with open(argv[0]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    epochs, later_run = epoch_rows(rows)
    if not epochs:
        raise SystemExit(f"{argv[0]} has no per-epoch lines with global_auc and loss: train with this "
                         f"directory's train.py first")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit('plot_metrics.py needs matplotlib: pip install -e ".[plot]"') from None
    x = [r["epoch"] for r in epochs]
    workers = epochs[-1].get("workers", 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(x, [r["loss"] for r in epochs], marker="o")
    ax1.set(xlabel="epoch", ylabel="loss", title="training loss (last batch, mean over workers)")
    ax2.plot(x, [r["global_auc"] for r in epochs], marker="o", color="tab:orange")
    ax2.set(xlabel="epoch", ylabel="AUC",
            title=f"global training AUC ({workers} worker{'s' if workers != 1 else ''})")
    for ax in (ax1, ax2):
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=100)
    plt.close(fig)
    print(f"wrote {argv[1]}: {len(epochs)} epoch{'s' if len(epochs) != 1 else ''}"
          f"{' (the last run in the file)' if later_run else ''}")


if __name__ == "__main__":
    main()
