"""Classify image files with a model exported by `evaluate.py --onnx`, with onnxruntime, numpy and PIL
alone (no torch, no mtlc): what an app or a service that receives the .onnx file runs.

    python examples/onnx_predict.py model.onnx photo.jpg more/*.png > predictions.csv

Prints path,prediction,confidence (the calibrated probability of the predicted class); a file that
cannot be read (or is none of the formats the project reads: JPEG, PNG, BMP, GIF, TIFF, WebP, PPM/PGM,
whatever its name) gets an empty prediction, a message on stderr and exit code 1 at the end. The images
are prepared as the project's training read them (mtlc.data.images.decode_bytes): EXIF orientation
applied, 16-bit and float images scaled to 8 bits by their range, RGB (transparency on white), JPEGs
decoded at a reduced scale still at least the model's size, then framed to a square of it as the
model's metadata says ("framing", mtlc.data.framing: squashed, its centre cropped with the aspect
kept, or padded with grey; squashed bilinearly for a model without it); the metadata also says that
size and the class names.
"""
import csv
import json
import math
import os
import stat
import sys

import numpy as np
import onnxruntime
from PIL import Image, ImageOps

# The formats a file is opened as, whatever its name, as the project reads images (mtlc.data.files.FORMATS):
# PIL would otherwise pick any decoder it has by the file's first bytes (a .png holding PostScript is
# handed to Ghostscript).
FORMATS = ("JPEG", "PNG", "BMP", "DIB", "GIF", "TIFF", "WEBP", "PPM")


def eight_bit(img):
    """A 16/32-bit integer or float image as 8-bit grayscale, scaled as mtlc.data.images.eight_bit does:
    integers by 0-255 or 0-65535 where they fit, floats in [0, 1] by 255, else from min to max."""
    x = np.asarray(img, dtype=np.float64)
    low, high = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if img.mode == "F" and 0 <= low and high <= 1:
        scale, offset = 255.0, 0.0
    elif img.mode != "F" and 0 <= low and high <= 255:
        scale, offset = 1.0, 0.0
    elif img.mode != "F" and 0 <= low and high <= 65535:
        scale, offset = 255.0 / 65535.0, 0.0
    else:
        scale, offset = 255.0 / (high - low) if high > low else 0.0, low
    return Image.fromarray(np.clip((x - offset) * scale, 0, 255).round().astype(np.uint8), "L")


SQUASH = dict(mode="squash", crop=1.0, interpolation="bilinear")


def framed(img, size, framing):
    """A PIL image as size x size, as mtlc.data.framing.Framing frames it."""
    method = Image.BICUBIC if framing["interpolation"] == "bicubic" else Image.BILINEAR
    if framing["mode"] == "squash":
        return img.resize((size, size), method)
    if framing["mode"] == "pad":
        return ImageOps.pad(img, (size, size), method, color=(127, 127, 127))
    short, (w, h) = decoded_side(size, framing), img.size  # timm's Resize then CenterCrop, torchvision's sums
    img = img.resize((short, int(short * h / w)) if w <= h else (int(short * w / h), short), method)
    left, top = int(round((img.width - size) / 2.0)), int(round((img.height - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def decoded_side(size, framing):
    return math.floor(size / framing["crop"]) if framing["mode"] == "crop" else size


def prepared(path, size, framing=SQUASH):
    """An image file as uint8 (3, size, size), as the project prepares it."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe named like an image would block the open
        raise ValueError("not a regular file")
    with Image.open(path, formats=FORMATS) as img:
        img.draft("RGB", (decoded_side(size, framing),) * 2)
        img = ImageOps.exif_transpose(img)
        if img.mode.startswith("I") or img.mode == "F":
            img = eight_bit(img)
        if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
            background = Image.new("RGBA", img.size, (255, 255, 255, 255))
            img = Image.alpha_composite(background, img.convert("RGBA"))
        img = framed(img.convert("RGB"), size, framing)
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def load(model_path):
    """The model's session, class names, image size and framing; exit code 2 with one line if it is none of ours."""
    try:
        session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        meta = session.get_modelmeta().custom_metadata_map
        framing = json.loads(meta["framing"]) if "framing" in meta else SQUASH
        if framing["mode"] not in ("squash", "crop", "pad") or not 0.5 <= float(framing["crop"]) <= 1:
            raise ValueError(f"its framing is none of mtlc's: {meta['framing']}")
        return session, json.loads(meta["classes"]), int(meta["image_size"]), framing
    except Exception as exc:  # onnxruntime's own types, or a model without evaluate.py --onnx's metadata
        print(f"cannot use {model_path} (made by evaluate.py --onnx?): {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)


def main(model_path, paths, batch_size=256):
    """Write the rows; returns the number of files that could not be read."""
    session, classes, size, framing = load(model_path)
    writer = csv.writer(sys.stdout)
    writer.writerow(["path", "prediction", "confidence"])
    failed = 0
    for start in range(0, len(paths), batch_size):
        images, readable = [], []
        for path in paths[start:start + batch_size]:
            try:
                images.append(prepared(path, size, framing))
                readable.append(path)
            except Exception as exc:  # PIL raises many types for a broken file
                failed += 1
                print(f"cannot read {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
                writer.writerow([path, "", ""])
        if readable:
            probabilities = session.run(None, {"images": np.stack(images)})[0]
            for path, row in zip(readable, probabilities):
                writer.writerow([path, classes[int(row.argmax())], f"{row.max():.4f}"])
    return failed


def run(args):
    """The exit code: 0, 1 when a file could not be read (or stdout failed), 2 on bad usage."""
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(args) < 2:
        print("usage: python examples/onnx_predict.py model.onnx IMAGE ... (--help: what it prints)", file=sys.stderr)
        return 2
    try:
        failed = main(args[0], args[1:])
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (| head): nothing more to say; stdout to /dev/null so exit stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # stdout's disk full, or a file-size limit: the rows written so far stay whole
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"cannot write the predictions: {exc}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
