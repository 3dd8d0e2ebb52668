"""Build an "own images" folder from a labeled dataset, and score predictions against the classes
kept aside. For the README's "Your own images" acceptance runs; a user with real images of their
own needs none of this.

    python examples/own_images.py cifar10 --archive ../shared/data/cifar10-jpeg.tar.xz --out data/own-cifar
    python examples/own_images.py digits --out data/own-digits
    python examples/own_images.py score --truth data/own-cifar-truth.csv --predictions preds.csv [--accepted]
    python examples/own_images.py label --data-dir data/own-cifar --truth data/own-cifar-truth.csv \
        --pick next.csv --n 250 --out data/own-cifar-next   # (or --seed S: n at random) labeled "by hand"
    python examples/own_images.py answer --truth data/own-cifar-truth.csv --pick next.csv --n 200 --out labels.csv
    python examples/own_images.py faults --data-dir data/own-cifar --truth data/own-cifar-truth.csv \
        --foreign data/own-digits --out data/faulty-cifar   # a copy with wrong labels, copies and strays planted

The folder gets labeled/<class>/* (--per-class images each), unlabeled/* (flat, shuffled, named
u00000.<ext>... so that no name says the class) and test/<class>/*. The true classes of the
unlabeled images go to <out>-truth.csv beside the folder, never inside it.
"""
import csv
import os
import random
import shutil
import tarfile
import tempfile
from pathlib import Path

import click


def write_folder(out, labeled, unlabeled, test, seed, copy=shutil.copyfile, suffix=None):
    """labeled / test: {class: [source files]}; unlabeled: [(source file, class)]. Copies the files
    (bytes unchanged, or with `copy(source, target)` to files ending in `suffix`) and writes the
    truth file."""
    out = Path(out)
    if out.exists():
        raise click.UsageError(f"{out} exists; choose a new --out")
    for part, groups in (("labeled", labeled), ("test", test)):
        for name, files in groups.items():
            (out / part / name).mkdir(parents=True)
            for f in files:
                copy(f, (out / part / name / Path(f).name).with_suffix(suffix or Path(f).suffix))
    (out / "unlabeled").mkdir(parents=True)
    order = list(unlabeled)
    random.Random(seed).shuffle(order)
    rows = []
    for i, (f, name) in enumerate(order):
        target = out / "unlabeled" / f"u{i:05d}{suffix or Path(f).suffix}"
        copy(f, target)
        rows.append((str(target.relative_to(out)), name))
    truth = out.parent / f"{out.name}-truth.csv"
    with open(truth, "w", newline="") as f:
        csv.writer(f).writerows([("path", "class")] + rows)
    click.echo(f"wrote {out} ({sum(map(len, labeled.values()))} labeled, {len(rows)} unlabeled, "
               f"{sum(map(len, test.values()))} test) and {truth}")


@click.group()
def main():
    """Build an own-images folder from a labeled dataset, or score predictions."""


@main.command()
@click.option("--archive", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The CIFAR-10 JPEG archive (train/<class>/NNNN.jpg, test/<class>/NNNN.jpg).")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--per-class", type=int, default=25, help="Labeled images per class (the first of each class).")
@click.option("--unlabeled-per-class", type=int, default=1000, help="Unlabeled images per class (the next ones).")
@click.option("--test-per-class", type=int, default=100, help="Test images per class (the first of each).")
@click.option("--train-start", type=int, default=0, help="Skip this many training images of each class first.")
@click.option("--test-start", type=int, default=0, help="Skip this many test images of each class first.")
@click.option("--seed", type=int, default=0, help="Seed of the unlabeled images' shuffled order.")
@click.option("--classes", default=None, help="Comma-separated classes to keep (e.g. airplane,automobile,ship,truck). "
                                               "[default: all ten]")
@click.option("--grayscale", is_flag=True, help="Store every image as an 8-bit grayscale PNG (PIL's L) instead of "
                                                 "copying the JPEG.")
def cifar10(archive, out, per_class, unlabeled_per_class, test_per_class, train_start, test_start, seed, classes,
            grayscale):
    """From the CIFAR-10 JPEG archive: labeled/, unlabeled/ (10,000 by default) and test/. With
    --train-start and --test-start, a second folder that shares no image with the first; with
    --classes and --grayscale, a different task from the same photos."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp)
        available = sorted(p.name for p in (root / "train").iterdir())
        wanted = classes.split(",") if classes else available
        unknown = sorted(set(wanted) - set(available))
        if unknown:
            raise click.UsageError(f"no class {', '.join(unknown)} in the archive (it has {', '.join(available)})")
        classes = wanted
        train = {c: sorted((root / "train" / c).iterdir())[train_start:] for c in classes}
        labeled = {c: files[:per_class] for c, files in train.items()}
        unlabeled = [(f, c) for c, files in train.items() for f in files[per_class:per_class + unlabeled_per_class]]
        test = {c: sorted((root / "test" / c).iterdir())[test_start:test_start + test_per_class] for c in classes}
        if grayscale:
            write_folder(out, labeled, unlabeled, test, seed, copy=to_grayscale_png, suffix=".png")
        else:
            write_folder(out, labeled, unlabeled, test, seed)


def to_grayscale_png(source, target):
    from PIL import Image
    with Image.open(source) as image:
        image.convert("L").save(target)


@main.command()
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--per-class", type=int, default=10, help="Labeled images per class.")
@click.option("--seed", type=int, default=0, help="Seed of the labeled draw and the unlabeled order.")
def digits(out, per_class, seed):
    """From scikit-learn's digits (8x8 PNGs): the test images are the 20% load_digits holds out
    (stratified, seed 0), the labeled ones a draw of --per-class per class from the rest, and the
    remaining training images unlabeled."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    train_idx, test_idx = train_test_split(np.arange(len(bunch.target)), test_size=0.2, random_state=0,
                                           stratify=bunch.target)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        def png(i):
            path = Path(tmp) / f"{i:04d}.png"
            Image.fromarray((bunch.images[i] * 255 / 16).round().astype(np.uint8), "L").save(path)
            return path
        labeled, unlabeled = {}, []
        for c in range(10):
            members = rng.permutation(train_idx[bunch.target[train_idx] == c])
            labeled[str(c)] = [png(i) for i in members[:per_class]]
            unlabeled += [(png(i), str(c)) for i in members[per_class:]]
        test = {str(c): [png(i) for i in test_idx[bunch.target[test_idx] == c]] for c in range(10)}
        write_folder(out, labeled, unlabeled, test, seed)


# Imagenette's classes (ImageNet's synsets), named as people name them.
IMAGENETTE = dict(n01440764="tench", n02102040="springer", n02979186="cassette_player", n03000684="chain_saw",
                  n03028079="church", n03394916="french_horn", n03417042="garbage_truck", n03425413="gas_pump",
                  n03445777="golf_ball", n03888257="parachute")


@main.command()
@click.option("--val", "val_dir", type=click.Path(exists=True, file_okay=False), required=True,
              help="Imagenette's val/ folder (one folder of JPEGs per synset), e.g. a checkout of "
                   "github.com/thunderInfy/imagenette: photos ImageNet's training never saw.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--per-class", type=int, default=10, help="Labeled images per class (a random draw).")
@click.option("--test-per-class", type=int, default=100, help="Test images per class (a random draw).")
@click.option("--seed", type=int, default=0, help="Seed of the draws and the unlabeled order.")
def imagenette(val_dir, out, per_class, test_per_class, seed):
    """Real photos: Imagenette's val/ (3,925 photos of 10 ImageNet classes, 160-500 px), --per-class
    labeled, --test-per-class test, the rest unlabeled. Its classes are ImageNet's own, so an
    ImageNet-trained backbone is at its best here: a ceiling, not a typical folder."""
    rng = random.Random(seed)
    labeled, unlabeled, test = {}, [], {}
    for synset, name in IMAGENETTE.items():
        files = sorted((Path(val_dir) / synset).iterdir())
        rng.shuffle(files)
        labeled[name], test[name] = files[:per_class], files[per_class:per_class + test_per_class]
        unlabeled += [(f, name) for f in files[per_class + test_per_class:]]
    write_folder(out, labeled, unlabeled, test, seed)


def listed_images(classes_dir, labels, columns):
    """[(file, class, group)] of a dataset: class folders under classes_dir (each image its own group),
    or the files of classes_dir named in a CSV (labels) by its columns FILE,CLASS[,GROUP]; a file
    named without its extension is found with .jpg or .png."""
    root = Path(classes_dir)
    if labels is None:
        return [(f, c.name, str(f)) for c in sorted(p for p in root.iterdir() if p.is_dir())
                for f in sorted(c.iterdir()) if f.is_file() and not f.name.startswith(".")]
    name, cls, *group = columns.split(",")
    items = []
    with open(labels, newline="") as f:
        for row in csv.DictReader(f):
            path = next((root / f"{row[name]}{s}" for s in ("", ".jpg", ".png") if (root / f"{row[name]}{s}").is_file()), None)
            if path is None:
                raise click.UsageError(f"{labels} names {row[name]}, which is not in {root}")
            items.append((path, row[cls], row[group[0]] if group else str(path)))
    return items


@main.command()
@click.option("--classes", "classes_dir", type=click.Path(exists=True, file_okay=False), required=True,
              help="A folder of one folder of images per class, or (with --labels) of the images themselves.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A CSV naming each image's class (e.g. HAM10000_metadata.csv).")
@click.option("--columns", default="image_id,dx,lesion_id", show_default=True,
              help="With --labels: its columns of the file's name, the class and a group (the images of one "
                   "group, e.g. one lesion, stay on one side of the test split).")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--per-class", type=int, default=10, show_default=True, help="Labeled images per class (a random draw).")
@click.option("--test-share", type=click.FloatRange(0, 0.9), default=0.2, show_default=True,
              help="The share of each class's groups held out as test/.")
@click.option("--imbalance", type=click.FloatRange(min=1), default=1.0, show_default=True,
              help="Keep of the images outside test/ a share falling exponentially over the classes (in a fixed "
                   "random order) so that the largest class has this many times the smallest's (CIFAR-10-LT's "
                   "profile); 1: all of them.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the labeled draw (redraw: another one).")
def photos(classes_dir, labels, columns, out, per_class, test_share, imbalance, seed):
    """A public photo dataset as an own-images folder: test/ a --test-share of each class (split by
    group), every other image in unlabeled/ under a neutral name (so an unbalanced dataset stays
    unbalanced there), then --per-class of each class drawn into labeled/<class>/ (redraw). The
    truth file lists every image outside test/ as unlabeled/<name>."""
    out = Path(out)
    if out.exists():
        raise click.UsageError(f"{out} exists; choose a new --out")
    by_class = {}
    for f, c, g in listed_images(classes_dir, labels, columns):
        by_class.setdefault(c, {}).setdefault(g, []).append(f)
    training, rows = [], []
    order = sorted(by_class)
    random.Random("imbalance").shuffle(order)
    for c, groups in sorted(by_class.items()):
        names = sorted(groups)
        random.Random(f"test {c}").shuffle(names)
        held = round(test_share * len(names))
        (out / "test" / c).mkdir(parents=True)
        for k, f in enumerate(f for g in names[:held] for f in groups[g]):
            shutil.copyfile(f, out / "test" / c / f"t{k:05d}{f.suffix.lower()}")
        kept = [f for g in names[held:] for f in groups[g]]
        share = imbalance ** (-order.index(c) / max(1, len(order) - 1))
        training += [(f, c) for f in kept[:max(per_class + 1, round(share * len(kept)))]]
    random.Random(0).shuffle(training)
    (out / "unlabeled").mkdir()
    for k, (f, c) in enumerate(training):
        shutil.copyfile(f, out / "unlabeled" / f"i{k:05d}{f.suffix.lower()}")
        rows.append((f"unlabeled/i{k:05d}{f.suffix.lower()}", c))
    truth = out.parent / f"{out.name}-truth.csv"
    with open(truth, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([("path", "class")] + rows)
    redraw_folder(out, truth, per_class, seed)


def redraw_folder(data_dir, truth, per_class, seed):
    """Every image of labeled/ back into unlabeled/, then per_class of each class (by seed) into labeled/<class>/."""
    data_dir, classes = Path(data_dir), read_truth(truth)
    for f in sorted((data_dir / "labeled").glob("*/*")) if (data_dir / "labeled").is_dir() else ():
        os.rename(f, data_dir / "unlabeled" / f.name)
    members = {}
    for key, c in sorted(classes.items()):
        members.setdefault(c, []).append(key.split("/")[-1])
    counts = []
    for c, names in sorted(members.items()):
        if len(names) <= per_class:
            raise click.UsageError(f"class {c} has {len(names)} images outside test/: too few for --per-class {per_class}")
        (data_dir / "labeled" / c).mkdir(parents=True, exist_ok=True)
        for name in random.Random(f"{seed} {c}").sample(names, per_class):
            os.rename(data_dir / "unlabeled" / name, data_dir / "labeled" / c / name)
        counts.append((len(names) - per_class, c))
    counts.sort()
    click.echo(f"{data_dir}: labeled draw {seed}, {per_class} a class; unlabeled per class: "
               f"{', '.join(f'{c} {n}' for n, c in reversed(counts))} (largest / smallest "
               f"{counts[-1][0] / max(1, counts[0][0]):.1f})")


@main.command()
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), required=True,
              help="A folder examples/own_images.py photos wrote.")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), required=True, help="Its truth file.")
@click.option("--per-class", type=int, default=10, show_default=True, help="Labeled images per class.")
@click.option("--seed", type=int, required=True, help="Seed of the new draw.")
def redraw(data_dir, truth, per_class, seed):
    """Draw the labeled images of a photos folder again, in place: the same files move, so the decode
    cache and the trunk's kept features serve every draw."""
    redraw_folder(data_dir, truth, per_class, seed)


LETTERS = "abdegnopqu"  # pairs a network can confuse: b d p q, a e o, n u


def render_letter(letter, fonts, rng, size=32):
    """One grayscale image of a letter: a random font, size, position, slant, stroke contrast, blur and noise."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont
    import numpy as np
    canvas = 3 * size
    image = Image.new("L", (canvas, canvas), 0)
    font = ImageFont.truetype(str(fonts[rng.integers(len(fonts))]), int(rng.integers(size * 5 // 8, size * 7 // 8)))
    ImageDraw.Draw(image).text((canvas / 2, canvas / 2), letter, fill=255, font=font, anchor="mm")
    image = image.rotate(float(rng.uniform(-20, 20)), resample=Image.BILINEAR)
    shift = rng.integers(-size // 8, size // 8 + 1, 2)
    image = image.crop((size + shift[0], size + shift[1], 2 * size + shift[0], 2 * size + shift[1]))
    image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0, 1.2))))
    paper = rng.uniform(0, 120)
    ink = rng.uniform(paper + 90, 255)  # at least 90 grey levels of contrast
    if rng.random() < 0.5:
        ink, paper = paper, ink  # dark on light or light on dark
    x = paper + (ink - paper) * np.asarray(image, dtype=np.float64) / 255 + rng.normal(0, 12, (size, size))
    return Image.fromarray(x.clip(0, 255).round().astype(np.uint8), "L")


@main.command()
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--per-class", type=int, default=10, help="Labeled images per class.")
@click.option("--unlabeled-per-class", type=int, default=150, help="Unlabeled images per class.")
@click.option("--test-per-class", type=int, default=100, help="Test images per class.")
@click.option("--seed", type=int, default=0, help="Seed of the rendering and the unlabeled order.")
def letters(out, per_class, unlabeled_per_class, test_per_class, seed):
    f"""Ten lowercase letters ({', '.join(LETTERS)}) rendered as 32 x 32 grayscale PNGs in matplotlib's
    bundled fonts (DejaVu, STIX, Computer Modern), each with its own size, position, slant, contrast,
    polarity, blur and noise: a task nobody here tuned on, built offline."""
    import matplotlib
    import numpy as np
    fonts = sorted(p for p in (Path(matplotlib.get_data_path()) / "fonts" / "ttf").glob("*.ttf")
                   if not p.name.startswith(("STIXSiz", "STIXNonUni", "cmex", "cmsy", "LastResort"))  # no letters
                   and "Display" not in p.name)  # DejaVu's Display fonts hold a few glyphs only
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        def draw(letter, i):
            path = Path(tmp) / f"{letter}{i:04d}.png"
            render_letter(letter, fonts, rng).save(path)
            return path
        parts = {}
        for letter in LETTERS:
            made = [draw(letter, i) for i in range(per_class + unlabeled_per_class + test_per_class)]
            parts[letter] = made[:per_class], made[per_class:per_class + unlabeled_per_class], made[-test_per_class:]
        write_folder(out, {c: p[0] for c, p in parts.items()}, [(f, c) for c, p in parts.items() for f in p[1]],
                     {c: p[2] for c, p in parts.items()}, seed)


def key(path):
    return "/".join(Path(path).parts[-2:])


def read_truth(truth):
    with open(truth, newline="") as f:
        return {key(r["path"]): r["class"] for r in csv.DictReader(f)}


@main.command()
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), required=True, help="The folder to copy.")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The true classes of its unlabeled images (<folder>-truth.csv).")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--pick", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A CSV with a path column (e.g. evaluate.py --suggest's): label its first --n rows.")
@click.option("--n", type=click.IntRange(min=1), required=True, help="How many unlabeled images to label.")
@click.option("--seed", type=int, default=0, help="Without --pick: the seed of the random draw.")
def label(data_dir, truth, out, pick, n, seed):
    """A copy of an own-images folder (hard links, its cache left behind) in which n of its unlabeled
    images are labeled from the truth file, as a user labeling them by hand would: the first n rows
    of --pick, or n drawn at random."""
    data_dir, out, classes = Path(data_dir), Path(out), read_truth(truth)
    if out.exists():
        raise click.UsageError(f"{out} exists; choose a new --out")
    unlabeled = sorted(p.relative_to(data_dir).as_posix() for p in (data_dir / "unlabeled").rglob("*") if p.is_file())
    if pick:
        with open(pick, newline="") as f:
            chosen = [Path(r["path"]).resolve().relative_to(data_dir.resolve()).as_posix() for r in csv.DictReader(f)][:n]
    else:
        chosen = random.Random(seed).sample(unlabeled, n)
    moved = {path: f"labeled/{classes[key(path)]}/{Path(path).name}" for path in chosen}
    for source in data_dir.rglob("*"):
        relative = source.relative_to(data_dir).as_posix()
        if source.is_file() and not relative.startswith("mtlc-cache/"):
            target = out / moved.get(relative, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)
    click.echo(f"wrote {out}: {len(moved)} of its {len(unlabeled)} unlabeled images labeled "
               f"({'the first of ' + str(pick) if pick else f'at random, seed {seed}'})")


def resaved(source, target, scale=0.8, quality=70):
    """A near copy as a photo library makes one: resized to `scale` of its size and saved as a JPEG."""
    from PIL import Image
    with Image.open(source) as image:
        image = image.convert("RGB")
        image.resize((max(8, round(image.width * scale)), max(8, round(image.height * scale))), Image.BILINEAR).save(
            target, format="JPEG", quality=quality)


@main.command()
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), required=True, help="The folder to copy.")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The true classes of its unlabeled images (<folder>-truth.csv).")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="The folder to create.")
@click.option("--flip", type=click.FloatRange(0, 1), default=0.05,
              help="Share of labeled/ and of test/ images moved into another class's folder.")
@click.option("--exact", type=click.FloatRange(0, 1), default=0.02,
              help="Share of all images copied, the same bytes, into another part (or the same one).")
@click.option("--near", type=click.FloatRange(0, 1), default=0.02,
              help="Share of all images copied resized (80%) and re-saved as JPEG (quality 70) the same way.")
@click.option("--foreign", type=click.Path(exists=True, file_okay=False), default=None,
              help="An image folder of another dataset whose images go into unlabeled/.")
@click.option("--foreign-share", type=click.FloatRange(0, 1), default=0.01, help="Their share of all images.")
@click.option("--seed", type=int, default=0, help="Seed of every draw.")
def faults(data_dir, truth, out, flip, exact, near, foreign, foreign_share, seed):
    """A copy of an own-images folder (hard links) with faults planted, and <out>-faults.csv listing
    each (path, kind, truth): kind label (truth: the true class), duplicate or leak (truth: the
    path of the copied image; leak where one side is in test/), outlier (an image of --foreign).
    For measuring evaluate.py --audit; <out>-truth.csv holds the unlabeled images' classes."""
    rng = random.Random(seed)
    data_dir, out, classes = Path(data_dir), Path(out), read_truth(truth)
    if out.exists():
        raise click.UsageError(f"{out} exists; choose a new --out")
    files = sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*")
                   if p.is_file() and not p.relative_to(data_dir).as_posix().startswith("mtlc-cache/"))
    for relative in files:
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        os.link(data_dir / relative, out / relative)
    images = [f for f in files if f.split("/")[0] in ("labeled", "unlabeled", "test")]
    class_of = {f: (f.split("/")[1] if not f.startswith("unlabeled/") else classes[key(f)]) for f in images}
    rows, truths = [], {f: class_of[f] for f in images if f.startswith("unlabeled/")}
    names = sorted({f.split("/")[1] for f in images if f.startswith("labeled/")})
    for part in ("labeled", "test"):
        members = [f for f in images if f.startswith(part + "/")]
        for f in rng.sample(members, round(flip * len(members))):
            wrong = rng.choice([c for c in names if c != class_of[f]])
            target = f"{part}/{wrong}/m{len(rows):04d}-{Path(f).name}"  # class folders may hold the same names
            (out / target).parent.mkdir(parents=True, exist_ok=True)
            os.rename(out / f, out / target)
            rows.append((target, "label", class_of[f]))
            images[images.index(f)] = target
            class_of[target] = class_of[f]
    count = 0
    for share, make in ((exact, shutil.copyfile), (near, resaved)):
        for f in rng.sample(images, round(share * len(images))):
            part = rng.choice(["unlabeled", "test"])
            count += 1
            suffix = Path(f).suffix if make is shutil.copyfile else ".jpg"
            target = (f"unlabeled/c{count:05d}{suffix}" if part == "unlabeled" else
                      f"test/{class_of[f]}/c{count:05d}{suffix}")
            (out / target).parent.mkdir(parents=True, exist_ok=True)
            make(out / f, out / target)
            kind = "leak" if (part == "test") != f.startswith("test/") else "duplicate"
            rows.append((target, kind, f))
            if part == "unlabeled":
                truths[target] = class_of[f]
    if foreign:
        strays = sorted(p for p in Path(foreign).rglob("*") if p.is_file() and p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        for k, f in enumerate(rng.sample(strays, min(len(strays), round(foreign_share * len(images))))):
            target = f"unlabeled/s{k:05d}{f.suffix}"
            shutil.copyfile(f, out / target)
            rows.append((target, "outlier", ""))
    with open(out.parent / f"{out.name}-faults.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([("path", "kind", "truth")] + rows)
    with open(out.parent / f"{out.name}-truth.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([("path", "class")] + sorted(truths.items()))
    kinds = {k: sum(r[1] == k for r in rows) for k in ("label", "duplicate", "leak", "outlier")}
    click.echo(f"wrote {out} and {out.name}-faults.csv: " + ", ".join(f"{n} {k}" for k, n in kinds.items()))


@main.command()
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The true classes of the folder's unlabeled images (<folder>-truth.csv).")
@click.option("--pick", type=click.Path(exists=True, dir_okay=False), required=True,
              help="A CSV with a path column (evaluate.py --predict or --suggest): label its first --n rows.")
@click.option("--n", type=click.IntRange(min=1), required=True, help="How many rows to label.")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The labels.csv to write (path,label).")
def answer(truth, pick, n, out):
    """Stand in for a person on the review page: labels.csv (path,label) with the true class of the
    first n images of --pick, for label.py --apply."""
    classes = read_truth(truth)
    with open(pick, newline="") as f:
        paths = [r["path"] for r in csv.DictReader(f)][:n]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(("path", "label"))
        writer.writerows((p, classes[key(p)]) for p in paths)
    click.echo(f"wrote {out}: the true classes of {len(paths)} images of {pick}")


@main.command()
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The <folder>-truth.csv written with the folder.")
@click.option("--predictions", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The CSV of `evaluate.py --predict <folder>/unlabeled --csv FILE`.")
@click.option("--accepted", "accepted_only", is_flag=True,
              help="Score only the rows accepted by evaluate.py --max-error (column accepted = 1).")
def score(truth, predictions, accepted_only):
    """Accuracy of predictions against the classes kept aside (paths matched by their last two parts)."""
    classes = read_truth(truth)
    with open(predictions, newline="") as f:
        known = [r for r in csv.DictReader(f) if key(r["path"]) in classes]
    rows = [r for r in known if not accepted_only or r["accepted"] == "1"]
    if known and not rows:
        click.echo("0 predictions accepted: nothing to score")
        return
    if not rows:
        raise click.UsageError(f"no {'accepted ' if accepted_only else ''}path of {predictions} is in {truth}")
    right = sum(r["prediction"] == classes[key(r["path"])] for r in rows)
    click.echo(f"{right}/{len(rows)} predictions right: accuracy {100 * right / len(rows):.2f}%, "
               f"error {100 - 100 * right / len(rows):.2f}% ({len(classes) - len(rows)} of the truth file not predicted)")


if __name__ == "__main__":
    main()
