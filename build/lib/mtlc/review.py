"""The review page: one self-contained HTML file (no server, no internet: it opens from disk in any
browser) showing predictions as thumbnails grouped by predicted class, least confident first, with
a class chooser per image and a Save button that downloads labels.csv (path,label) of what the user
confirmed or corrected, for label.py. The page's HTML, CSS and script live in review_page/; this
module fills them with the predictions and embedded thumbnails.
"""
import base64
import hashlib
import html
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .console import is_text
from .images import thumbnail_jpeg
from .runs import atomic_write

ASSETS = Path(__file__).resolve().parent / "review_page"
THUMBNAIL_SIZE = 96  # pixels, the longer side; about 2-4 kB each as JPEG
DEFAULT_PER_CLASS = 1000  # images shown per predicted class: 10 classes stay under about 40 MB


def shown_items(predictions, classes, per_class):
    """The readable predictions to show, per predicted class the per_class least confident (the
    ones most worth a look), least confident first; and {class: (shown, total)}."""
    groups = {c: sorted((p for p in predictions if p.label == c), key=lambda p: (p.confidence, str(p.path)))
              for c in classes}
    return ([p for c in classes for p in groups[c][:per_class]],
            {c: (min(per_class, len(groups[c])), len(groups[c])) for c in classes})


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


def write_review(out, predictions, classes, *, per_class=DEFAULT_PER_CLASS, threshold=None, max_error=None,
                 title="Review the predictions", summary=""):
    """Write the page for these predictions (the Prediction rows of predictions.py; unreadable
    files, and files whose names are not text (not valid UTF-8: the page could not give them back
    to label.py), are listed apart). threshold: the --max-error threshold, None where no confidence
    reaches it (nothing accepted) or max_error is None. Returns (images shown, images whose
    thumbnail failed)."""
    readable = [p for p in predictions if p.label is not None and is_text(str(p.path))]
    items, shown = shown_items(readable, classes, per_class)
    with ThreadPoolExecutor(8) as pool:  # PIL releases the GIL while decoding
        thumbnails = list(pool.map(lambda p: thumbnail_jpeg(p.path, THUMBNAIL_SIZE), items))
    failed = [dict(path=str(p.path), reason=p.reason) for p in predictions if p.label is None]
    failed += [dict(path=str(p.path).encode("utf-8", "replace").decode(), reason="its name is not valid UTF-8 text: "
                    "rename it to review it here") for p in predictions if p.label is not None and not is_text(str(p.path))]
    failed += [dict(path=str(p.path), reason="no thumbnail could be made") for p, t in zip(items, thumbnails) if t is None]
    data = dict(
        classes=list(classes), threshold=threshold, max_error=max_error, summary=summary, shown=shown, failed=failed,
        storage_key=hashlib.sha256("\n".join(str(p.path) for p in predictions).encode("utf-8", "surrogateescape")).hexdigest()[:16],
        items=[dict(path=str(p.path), name=Path(p.path).name, label=p.label, confidence=p.confidence,
                    runner_up=p.runner_up, accepted=None if max_error is None else (
                        threshold is not None and p.confidence >= threshold),
                    thumb="data:image/jpeg;base64," + base64.b64encode(t).decode())
               for p, t in zip(items, thumbnails) if t is not None])
    page = fill((ASSETS / "page.html").read_text(), dict(
        CSS=(ASSETS / "page.css").read_text(), SCRIPT=(ASSETS / "page.js").read_text(),
        TITLE=html.escape(title.encode("utf-8", "replace").decode()), DATA=script_json(data)))
    atomic_write(out, lambda f: f.write(page.encode("utf-8", "replace")))
    return len(data["items"]), sum(t is None for t in thumbnails)
