"""TensorBoard event files for a run (`runtime.tensorboard: true`), written by TensorBoard's own writer through
`torch.utils.tensorboard` into `<run folder>/tensorboard/`: accuracy per round, test-then-train accuracy, losses per
epoch, slots, memory bytes and stream throughput as the run goes, the summary metrics at its end.
`tensorboard --logdir runs` shows them."""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class TensorBoardLog:
    def __init__(self, run_dir: Path):
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        self.epochs: dict[str, int] = {}  # epochs logged per trainer, the step of its loss curve

    def round(self, state, prequential_curve: list[dict]) -> None:
        """Log the round `state` (a runner.RunState) has just committed; `prequential_curve`: the run's test-then-train
        figures so far, a point per round."""
        entry = state.last_log
        step = entry["round"] + 1
        add = self.writer.add_scalar
        for point in prequential_curve[-1:]:
            if point["accuracy"] is not None:
                add("prequential/accuracy", point["accuracy"], step)
                add("prequential/window", point["window"], step)
        for task, accuracy in entry["accuracy"].items():
            add(f"accuracy/task{task}", accuracy, step)
        if entry["mean_evaluated"] is not None:
            add("accuracy/mean_evaluated", entry["mean_evaluated"], step)
        for label, losses in entry.get("epoch_losses", {}).items():
            for loss in losses:
                self.epochs[label] = self.epochs.get(label, 0) + 1
                add(f"loss/{label.replace(' ', '')}", loss, self.epochs[label])
        for key, value in entry["memory"].items():
            add("slots" if key == "num_slots" else f"memory_bytes/{key}", value, step)
        if entry["seconds"].get("stream"):
            add("throughput/batches_per_second", entry["batches"] / entry["seconds"]["stream"], step)
        add("refused_rows", entry["refused"], step)
        self.writer.flush()

    def close(self, metrics: dict) -> None:
        """The run's summary metrics (A_last, Ā, forgetting, BWT) at its last round, then close the files."""
        step = len(metrics["round_log"])
        for key, value in (metrics.get("summary") or {}).items():
            self.writer.add_scalar(f"summary/{key}", value, step)
        prequential = metrics.get("prequential") or {}
        if prequential.get("near_future_accuracy") is not None:
            self.writer.add_scalar("prequential/near_future", prequential["near_future_accuracy"], step)
        self.writer.close()
