"""The review page: one self-contained HTML file (no server, no internet: it opens from disk in any
browser) showing predictions as thumbnails grouped by predicted class, least confident first, with
a class chooser per image and a Save button that downloads labels.csv (path,label,blake2b,action) of
what the user confirmed or corrected (and, on an audit's page, set aside), for label.py. Each image
is known by its path and the hash of its bytes: a decision kept in the browser never carries over
to another picture saved under the same name, and label.py refuses a row whose file changed since. The page's HTML, CSS and script live in review_page/; this
module fills them with the predictions and embedded thumbnails.
"""
import base64
import hashlib
import html
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..data.images import thumbnail_jpeg
from ..disk.console import is_text
from ..disk.runs import atomic_write
from .prediction_rows import is_accepted

ASSETS = Path(__file__).resolve().parent / "review_page"
THUMBNAIL_SIZE = 96  # pixels, the longer side; about 2-4 kB each as JPEG
DEFAULT_PER_CLASS = 1000  # images shown per predicted class
# Images a page shows in all, whatever the folder's size: about 5-10 MB of thumbnails, a page that
# opens at once (the CIFAR-10 folder's 8,432 at 1,000 a class made 11.8 MB).
DEFAULT_MOST = 2000
LISTED_MAX = 1000  # files a page names among those it cannot show (unreadable ones); more are counted


def least_confident(predictions, classes, per_class, most):
    """The readable predictions worth a look first, from a stream read once and never held whole:
    per predicted class the per_class least confident (those like no class before any), then at most
    `most` in all, taken from the classes in turn (each class's least confident first); returned grouped by class, least confident
    first, with {class: (shown, total)}."""
    kept, total = {c: [] for c in classes}, {c: 0 for c in classes}
    for p in predictions:
        group = kept[p.label]
        group.append(p)
        total[p.label] += 1
        if len(group) >= 2 * per_class:  # sorted and cut now and then: n log(per_class), memory per_class
            group.sort(key=order)
            del group[per_class:]
    for group in kept.values():
        group.sort(key=order)
        del group[per_class:]
    taken, left = {c: 0 for c in classes}, most
    for rank in range(per_class):
        for c in classes:
            if left and rank < len(kept[c]):
                taken[c] += 1
                left -= 1
    return [p for c in classes for p in kept[c][:taken[c]]], {c: (taken[c], total[c]) for c in classes}


def order(p):
    return not p.like_no_class, p.confidence, str(p.path)


# What must not appear raw in JSON inside a <script> element: "<" (a "</script>" or "<!--" in a file
# name ends or hides the page's own script), ">" and "&" for good measure, and U+2028/U+2029, line
# breaks to older JavaScript parsers. Each is written as its \u escape, which JSON reads back as is.
SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value):
    """value as JSON that can sit inside a <script> element whatever its strings hold."""
    return re.sub("[<>&\u2028\u2029]", lambda m: SCRIPT_UNSAFE[m.group()], json.dumps(value))


def fill(template, values):
    """The template with each __KEY__ replaced in one pass: a value that holds another key's
    placeholder (a file name "__DATA__.png" in the title) is never replaced again."""
    return re.sub(r"__([A-Z]+)__", lambda m: values.get(m.group(1), m.group()), template)


def thumbs(paths):
    """The data: URL of each file's thumbnail, None where it could not be made (a pool of threads:
    PIL releases the GIL while decoding)."""
    with ThreadPoolExecutor(8) as pool:
        jpegs = list(pool.map(lambda p: thumbnail_jpeg(p, THUMBNAIL_SIZE), paths))
    return [None if j is None else "data:image/jpeg;base64," + base64.b64encode(j).decode() for j in jpegs]


def write_page(out, title, data):
    """The page, its data embedded: one self-contained HTML file."""
    page = fill((ASSETS / "page.html").read_text(), dict(
        CSS=(ASSETS / "page.css").read_text(), SCRIPT=(ASSETS / "page.js").read_text(),
        TITLE=html.escape(title.encode("utf-8", "replace").decode()), DATA=script_json(data)))
    atomic_write(out, lambda f: f.write(page.encode("utf-8", "replace")))


class StorageKey:
    """Where the page keeps its decisions in the browser: one place per set of images, the hash of
    their paths (one per line), taken as they pass."""

    def __init__(self):
        self.hash, self.empty = hashlib.sha256(), True

    def add(self, path):
        self.hash.update((b"" if self.empty else b"\n") + str(path).encode("utf-8", "surrogateescape"))
        self.empty = False

    def value(self):
        return self.hash.hexdigest()[:16]


def storage_key(paths):
    key = StorageKey()
    for path in paths:
        key.add(path)
    return key.value()


class Unshown:
    """The files a page cannot show, named up to LISTED_MAX and counted beyond."""

    def __init__(self):
        self.listed, self.count = [], 0

    def add(self, path, reason):
        self.count += 1
        if len(self.listed) < LISTED_MAX:
            self.listed.append(dict(path=path, reason=reason))

    def entries(self):
        more = self.count - len(self.listed)
        return self.listed + ([dict(path=f"... and {more:,} more", reason="not listed here")] if more else [])


def write_review(out, predictions, classes, *, per_class=DEFAULT_PER_CLASS, most=DEFAULT_MOST, threshold=None,
                 max_error=None, title="Review the predictions", summary=""):
    """Write the page for these predictions (the Prediction rows of predictions.py, a stream read
    once: a million rows hold no more memory than the page's own): at most per_class images per
    predicted class and `most` in all, the least confident (least_confident); unreadable files, and
    files whose names are not text (not valid UTF-8: the page could not give them back to label.py),
    are listed apart. threshold: the --max-error threshold, None where no confidence reaches it
    (nothing accepted) or max_error is None. Returns (images shown, images listed apart)."""
    unshown, key = Unshown(), StorageKey()

    def readable():
        for p in predictions:
            key.add(p.path)
            if p.label is None:
                unshown.add(str(p.path), p.reason)
            elif not is_text(str(p.path)):
                unshown.add(str(p.path).encode("utf-8", "replace").decode(),
                            "its name is not valid UTF-8 text: rename it to review it here")
            else:
                yield p

    items, shown = least_confident(readable(), classes, per_class, most)
    thumbnails = thumbs([p.path for p in items])
    for p, t in zip(items, thumbnails):
        if t is None:
            unshown.add(str(p.path), "no thumbnail could be made")
    left_out = sum(total for _, total in shown.values()) - len(items)
    data = dict(
        classes=list(classes), threshold=threshold, max_error=max_error, shown=shown, failed=unshown.entries(),
        summary=summary + (f"; the page shows the {len(items):,} least confident (at most {per_class:,} of a class, "
                           f"{most:,} in all), {left_out:,} more are in the CSV" if left_out else ""),
        storage_key=key.value(), findings=[], audit=False,
        items=[dict(path=str(p.path), name=Path(p.path).name, label=p.label, confidence=p.confidence,
                    runner_up=p.runner_up, accepted=None if max_error is None else (
                        threshold is not None and is_accepted(p, threshold)), thumb=t, digest=p.digest,
                    like_no_class=p.like_no_class)
               for p, t in zip(items, thumbnails) if t is not None])
    write_page(out, title, data)
    return len(data["items"]), unshown.count


def write_audit_review(out, findings, classes, *, most=DEFAULT_MOST, title="Is the folder right?", summary=""):
    """Write the page of an audit (audit.py's findings, each kind in descending score): the doubtful
    labels as cards grouped by the class suggested for them, most doubtful first, the suggestion
    preselected (one key confirms the fix; Save writes labels.csv, which label.py applies to labeled/
    and test/ images), and the copies and outliers found, each with its thumbnail (and its copy's);
    at most `most` of each kind (the most likely problems; the audit CSV has every one). Returns (cards
    shown, thumbnails that failed)."""
    unshown = Unshown()
    for f in findings:
        if not (is_text(f.path) and is_text(f.suggestion)):
            unshown.add(f.path.encode("utf-8", "replace").decode(), f"{f.kind}: its name (or its copy's) is not valid "
                        "UTF-8 text: rename it to review it here; the audit CSV has it")
    all_labels = [f for f in findings if f.kind == "label" and is_text(f.path)]
    all_others = [f for f in findings if f.kind != "label" and is_text(f.path) and is_text(f.suggestion)]
    labels = all_labels[:most]
    others = [f for kind in dict.fromkeys(f.kind for f in all_others) for f in [f for f in all_others if f.kind == kind][:most]]
    thumbnails = thumbs([f.path for f in labels] + [f.path for f in others] + [f.suggestion for f in others if f.suggestion])
    label_thumbs, other_thumbs = thumbnails[:len(labels)], thumbnails[len(labels):len(labels) + len(others)]
    copy_thumbs = iter(thumbnails[len(labels) + len(others):])
    for f, t in zip(labels, label_thumbs):
        if t is None:
            unshown.add(f.path, "no thumbnail could be made")
    shown = {c: (sum(f.suggestion == c for f in labels), sum(f.suggestion == c for f in all_labels)) for c in classes}
    left_out = [f"{len(every) - len(kept):,} {what}" for every, kept, what in (
        (all_labels, labels, "doubtful labels"), (all_others, others, "copies, leaks and strays")) if len(every) > len(kept)]
    data = dict(
        classes=list(classes), threshold=None, max_error=None, shown=shown, failed=unshown.entries(),
        summary=summary + (f"; the page shows the {most:,} most likely of each kind: {' and '.join(left_out)} more are "
                           f"in the audit CSV" if left_out else ""),
        storage_key=storage_key(f.path for f in findings), audit=True,
        items=[dict(path=f.path, name=Path(f.path).name, label=f.suggestion, confidence=1 - f.score, given=f.given,
                    runner_up=None, accepted=None, thumb=t, digest=f.digest)
               for f, t in zip(labels, label_thumbs) if t is not None],
        findings=[dict(kind=f.kind, path=f.path, name=Path(f.path).name, copy=f.suggestion, detail=f.detail, thumb=t,
                       copy_thumb=next(copy_thumbs) if f.suggestion else None, digest=f.digest)
                  for f, t in zip(others, other_thumbs)])
    write_page(out, title, data)
    return len(data["items"]), sum(t is None for t in thumbnails)
