"""Peak memory of decoding huge images (docs/decode-memory.md): a folder of 9,400 x 9,400 RGBA PNGs
(a few hundred KB each, under Pillow's pixel limit) decoded to 32 px by images.decode_batches on W
threads, in a fresh Python each time, its peak resident memory (ru_maxrss) against a Python that only
imported the same modules. --compare ROOT measures another checkout the same way (an older commit's
`git worktree`), in the same call.

    python tools/bench_decode_memory.py --images 8 --workers 1 --workers 8 --out docs/decode-memory.json
"""
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
# The child: import, measure, decode every file of the folder, measure again (kB, Linux's unit).
CHILD = """
import resource, sys, time
sys.path.insert(0, sys.argv[1])
try:
    from mtlc.data.images import decode_batches
except ImportError:  # an older checkout's flat layout
    from mtlc.images import decode_batches
from pathlib import Path
paths = sorted(Path(sys.argv[2]).glob("*.png"))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if sys.argv[4] == "decode":
    for _ in decode_batches(paths, 32, 256, workers=int(sys.argv[3])):
        pass
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - start)
"""


def write_images(folder, n, side):
    """n different RGBA PNGs of side x side pixels (mostly one colour: small files, huge images)."""
    for k in range(n):
        pixels = np.zeros((side, side, 4), np.uint8)
        pixels[..., 0], pixels[..., 3] = 40 + 20 * k, 128
        pixels[: side // 8, : side // 8, 1] = 255
        Image.fromarray(pixels, "RGBA").save(folder / f"huge-{k}.png")
    return sum(p.stat().st_size for p in folder.glob("*.png"))


def measure(root, folder, workers):
    def child(mode):
        res = subprocess.run([sys.executable, "-c", CHILD, str(root), str(folder), str(workers), mode],
                             capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if res.returncode != 0:
            raise click.ClickException(res.stderr.strip().splitlines()[-1])
        return [float(v) for v in res.stdout.split()]
    imported = child("import")[1]
    _, peak, seconds = child("decode")
    return dict(workers=workers, peak_mb=round(peak / 1024), imports_mb=round(imported / 1024),
                decoding_mb=round((peak - imported) / 1024), seconds=round(seconds, 1))


@click.command()
@click.option("--images", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--side", type=click.IntRange(min=64), default=9400, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), multiple=True, default=(1, 8), show_default=True)
@click.option("--compare", type=click.Path(file_okay=False, exists=True), default=None,
              help="Another checkout to measure the same way (before).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the record as JSON here.")
def main(images, side, workers, compare, out):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = write_images(folder, images, side)
        record = dict(machine=platform.processor() or platform.machine(), cores=os.cpu_count(), images=images,
                      side=side, folder_kb=size // 1024, runs={})
        for name, root in (("this", ROOT), ("compare", compare)):
            if root is not None:
                record["runs"][name] = [measure(root, folder, w) for w in workers]
                for r in record["runs"][name]:
                    click.echo(f"{name}: {w_line(r)}")
    if out:
        Path(out).write_text(json.dumps(record, indent=1) + "\n")


def w_line(r):
    return (f"{r['workers']} threads: peak {r['peak_mb']:,} MB ({r['decoding_mb']:,} MB over the imports), "
            f"{r['seconds']} s")


if __name__ == "__main__":
    main()
