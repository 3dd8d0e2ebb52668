"""Ten images unlike any photo of a folder's classes, as a real folder gathers them: blank pages, a
one-pixel file, noise, a gradient, a chart, a page of text, and scikit-learn's two sample photos (a
palace and a flower, classes no CIFAR-10 folder has). For measuring how the audit's outliers and
--predict treat them (docs/audit.md, "Junk among photos").

    python examples/junk_images.py --out mydata/unlabeled/junk
"""
from pathlib import Path

import click
import matplotlib
import numpy as np
from PIL import Image, ImageDraw
from sklearn.datasets import load_sample_images

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


@click.command()
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the noise and the chart.")
def main(out, seed):
    """Write the ten images into OUT (a new folder)."""
    out = Path(out)
    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    Image.new("RGB", (1, 1), (200, 30, 30)).save(out / "one-pixel.png")
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(out / "noise-32.png")
    Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(out / "noise-256.jpg")
    Image.new("RGB", (64, 64), (255, 255, 255)).save(out / "white.png")
    Image.new("RGB", (64, 64), (0, 0, 0)).save(out / "black.png")
    page = Image.new("RGB", (200, 100), "white")
    draw = ImageDraw.Draw(page)
    for line in range(6):
        draw.text((5, 5 + 15 * line), "Invoice 2026-12 total due 431.20 EUR", fill="black")
    page.save(out / "text.png")
    ramp = np.linspace(0, 1, 128)
    Image.fromarray((np.add.outer(ramp, ramp) * 127 % 255).astype(np.uint8)).convert("RGB").save(out / "gradient.png")
    figure, axes = plt.subplots(figsize=(3, 2))
    axes.plot(rng.normal(size=50).cumsum())
    figure.savefig(out / "chart.png")
    plt.close(figure)
    for name, image in zip(("china.jpg", "flower.jpg"), load_sample_images().images):
        Image.fromarray(image).save(out / name)
    click.echo(f"wrote 10 images into {out}")


if __name__ == "__main__":
    main()
