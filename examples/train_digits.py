"""Train the MLP or the small CNN on the 8x8 handwritten digits on the Oar device.

    python examples/train_digits.py --device npu --model cnn --epochs 5

Prints the loss and the held-out accuracy after each epoch; exits non-zero if
the final accuracy is below --min-accuracy.
"""

from __future__ import annotations

import sys
import time

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import oar
import oar.nn.functional as F
from oar.models import CNN, MLP, data


def accuracy(model, split: data.Digits, flat: bool, dev) -> float:
    model.eval()
    correct = 0
    with oar.no_grad():
        for images, labels in data.digits_batches(split, 256, seed=0, flat=flat):
            logits = model(oar.tensor(images, device=dev)).numpy()
            correct += int(np.sum(np.argmax(logits, axis=1) == labels))
    model.train()
    return correct / len(split)


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True, help="Device type or 'type:index'.")
@click.option("--model", "kind", type=click.Choice(["mlp", "cnn"]), default="cnn", show_default=True)
@click.option("--epochs", default=5, show_default=True)
@click.option("--batch-size", default=32, show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--min-accuracy", default=0.9, show_default=True, help="Fail below this held-out accuracy.")
def main(device_spec, kind, epochs, batch_size, lr, seed, min_accuracy) -> None:
    console = Console(highlight=False)
    dev = oar.set_device(device_spec)
    oar.manual_seed(seed)
    train, test = data.load_digits(seed=seed)
    flat = kind == "mlp"
    model = (MLP() if flat else CNN()).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"[bold]{kind.upper()}[/bold] ({n_params:,} parameters) on [bold]{escape(str(dev))}[/bold]: "
                  f"{len(train)} training and {len(test)} held-out digits")
    optimizer = oar.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    console.print(f"epoch 0: held-out accuracy {accuracy(model, test, flat, dev):.1%} (chance 10%)")
    started = time.perf_counter()
    acc = 0.0
    batches_per_epoch = -(-len(train) // batch_size)
    with Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss [cyan]{task.fields[loss]}[/cyan]"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        for epoch in range(1, epochs + 1):
            task = progress.add_task("", total=batches_per_epoch, epoch=epoch, loss="-")
            total, count = 0.0, 0
            for images, labels in data.digits_batches(train, batch_size, seed=seed, epoch=epoch, flat=flat):
                loss = F.cross_entropy(model(oar.tensor(images, device=dev)), oar.tensor(labels, device=dev))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                value = loss.item()
                total, count = total + value * labels.shape[0], count + labels.shape[0]
                progress.update(task, advance=1, loss=f"{value:.3f}")
            progress.remove_task(task)
            acc = accuracy(model, test, flat, dev)
            console.print(f"epoch {epoch}: train loss {total / count:.3f}, held-out accuracy {acc:.1%}")
    fallbacks = oar.fallback_stats()
    console.print(f"{epochs} epochs in {time.perf_counter() - started:.1f} s; ops that fell back to the host: "
                  f"{sum(fallbacks.values())}{' ' + escape(str(fallbacks)) if fallbacks else ''}")
    if acc < min_accuracy:
        console.print(f"[red]held-out accuracy {acc:.1%} is below {min_accuracy:.0%}[/red]")
        sys.exit(1)


if __name__ == "__main__":
    main()
