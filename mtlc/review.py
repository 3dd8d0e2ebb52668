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


def storage_key(paths):
    """Where the page keeps its decisions in the browser: one place per set of images."""
    return hashlib.sha256("\n".join(map(str, paths)).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def write_review(out, predictions, classes, *, per_class=DEFAULT_PER_CLASS, threshold=None, max_error=None,
                 title="Review the predictions", summary=""):
    """Write the page for these predictions (the Prediction rows of predictions.py; unreadable
    files, and files whose names are not text (not valid UTF-8: the page could not give them back
    to label.py), are listed apart). threshold: the --max-error threshold, None where no confidence
    reaches it (nothing accepted) or max_error is None. Returns (images shown, images whose
    thumbnail failed)."""
    readable = [p for p in predictions if p.label is not None and is_text(str(p.path))]
    items, shown = shown_items(readable, classes, per_class)
    thumbnails = thumbs([p.path for p in items])
    failed = [dict(path=str(p.path), reason=p.reason) for p in predictions if p.label is None]
    failed += [dict(path=str(p.path).encode("utf-8", "replace").decode(), reason="its name is not valid UTF-8 text: "
                    "rename it to review it here") for p in predictions if p.label is not None and not is_text(str(p.path))]
    failed += [dict(path=str(p.path), reason="no thumbnail could be made") for p, t in zip(items, thumbnails) if t is None]
    data = dict(
        classes=list(classes), threshold=threshold, max_error=max_error, summary=summary, shown=shown, failed=failed,
        storage_key=storage_key(p.path for p in predictions), findings=[], audit=False,
        items=[dict(path=str(p.path), name=Path(p.path).name, label=p.label, confidence=p.confidence,
                    runner_up=p.runner_up, accepted=None if max_error is None else (
                        threshold is not None and p.confidence >= threshold), thumb=t, digest=p.digest)
               for p, t in zip(items, thumbnails) if t is not None])
    write_page(out, title, data)
    return len(data["items"]), sum(t is None for t in thumbnails)


def write_audit_review(out, findings, classes, *, title="Is the folder right?", summary=""):
    """Write the page of an audit (audit.py's findings): the doubtful labels as cards grouped by the
    class suggested for them, most doubtful first, the suggestion preselected (one key confirms the
    fix; Save writes labels.csv, which label.py applies to labeled/ and test/ images), and the copies
    and outliers found, each with its thumbnail (and its copy's). Returns (cards shown, thumbnails
    that failed)."""
    labels = [f for f in findings if f.kind == "label" and is_text(f.path)]
    others = [f for f in findings if f.kind != "label" and is_text(f.path) and is_text(f.suggestion)]
    thumbnails = thumbs([f.path for f in labels] + [f.path for f in others] + [f.suggestion for f in others if f.suggestion])
    label_thumbs, other_thumbs = thumbnails[:len(labels)], thumbnails[len(labels):len(labels) + len(others)]
    copy_thumbs = iter(thumbnails[len(labels) + len(others):])
    shown = {c: (sum(f.suggestion == c for f in labels),) * 2 for c in classes}
    data = dict(
        classes=list(classes), threshold=None, max_error=None, summary=summary, shown=shown,
        failed=[dict(path=f.path, reason="no thumbnail could be made") for f, t in zip(labels, label_thumbs) if t is None] +
               [dict(path=f.path.encode("utf-8", "replace").decode(), reason=f"{f.kind}: its name (or its copy's) is not "
                     "valid UTF-8 text: rename it to review it here; the audit CSV has it")
                for f in findings if not (is_text(f.path) and is_text(f.suggestion))],
        storage_key=storage_key(f.path for f in findings), audit=True,
        items=[dict(path=f.path, name=Path(f.path).name, label=f.suggestion, confidence=1 - f.score, given=f.given,
                    runner_up=None, accepted=None, thumb=t, digest=f.digest)
               for f, t in zip(labels, label_thumbs) if t is not None],
        findings=[dict(kind=f.kind, path=f.path, name=Path(f.path).name, copy=f.suggestion, detail=f.detail, thumb=t,
                       copy_thumb=next(copy_thumbs) if f.suggestion else None, digest=f.digest)
                  for f, t in zip(others, other_thumbs)])
    write_page(out, title, data)
    return len(data["items"]), sum(t is None for t in thumbnails)
