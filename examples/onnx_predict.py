"""Classify image files with a model exported by `evaluate.py --onnx`, with onnxruntime, numpy and PIL
alone (no torch, no mtlc): what an app or a service that receives the .onnx file runs.

    python examples/onnx_predict.py model.onnx photo.jpg more/*.png > predictions.csv

Prints path,prediction,confidence (the calibrated probability of the predicted class). The images are
prepared as the project's training read them (mtlc.images.decode_bytes) for 8-bit images: EXIF
orientation applied, RGB (transparency on white), JPEGs decoded at a reduced scale still at least the
model's size, then resized bilinearly to it (16-bit and float images: mtlc.images.as_seen scales
them first); the model's metadata says that size and the class names.
"""
import csv
import json
import sys

import numpy as np
import onnxruntime
from PIL import Image, ImageOps


def prepared(path, size):
    """An image file as uint8 (3, size, size), as the project prepares it."""
    with Image.open(path) as img:
        img.draft("RGB", (size, size))
        img = ImageOps.exif_transpose(img)
        if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
            background = Image.new("RGBA", img.size, (255, 255, 255, 255))
            img = Image.alpha_composite(background, img.convert("RGBA"))
        img = img.convert("RGB").resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def main(model_path, paths, batch_size=256):
    session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    classes, size = json.loads(meta["classes"]), int(meta["image_size"])
    writer = csv.writer(sys.stdout)
    writer.writerow(["path", "prediction", "confidence"])
    for start in range(0, len(paths), batch_size):
        batch = paths[start:start + batch_size]
        probabilities = session.run(None, {"images": np.stack([prepared(p, size) for p in batch])})[0]
        for path, row in zip(batch, probabilities):
            writer.writerow([path, classes[int(row.argmax())], f"{row.max():.4f}"])


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python examples/onnx_predict.py model.onnx IMAGE ...")
    main(sys.argv[1], sys.argv[2:])
