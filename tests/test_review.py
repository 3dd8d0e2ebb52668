"""The review page: filled by review.py, checked as data without a browser, then used as a person
would in headless Chromium (Debian's chromium and chromium-driver, driven by selenium): the
thumbnails and groups are there, one label is corrected and one confirmed, Save downloads
labels.csv, and label.py applies it."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mtlc.use.classifier import Prediction
from mtlc.use.review import least_confident, write_review
from conftest import ROOT, read_rows, run, save_labels

def page_data(page):
    found = re.search(r'<script type="application/json" id="review-data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_page_holds_its_data_and_nothing_from_outside(tmp_path):
    from PIL import Image
    rows = []
    (tmp_path / "<").mkdir()
    for i in range(7):
        path = tmp_path / "<" / f"script>{i}.png"  # .../</script>0.png would end the data block if not escaped
        assert "</script>" in str(path)
        Image.new("RGB", (60, 30), (30 * i, 0, 0)).save(path)
        rows.append(Prediction(path, "ab"[i % 2], round(0.5 + i / 20, 4), "ba"[i % 2], digest=f"{i:032x}"))
    rows.append(Prediction(tmp_path / "broken.png", None, None, None, reason="OSError: truncated"))
    shown, apart = write_review(tmp_path / "r.html", rows, ["a", "b"], per_class=2, threshold=0.7, max_error=5)
    page = (tmp_path / "r.html").read_text()
    data = page_data(page)
    assert shown == 4 and apart == 1 and data["shown"] == {"a": [2, 4], "b": [2, 3]}
    assert [(d["label"], d["confidence"]) for d in data["items"]] == [("a", 0.5), ("a", 0.6), ("b", 0.55), ("b", 0.65)]
    assert all(d["thumb"].startswith("data:image/jpeg;base64,") for d in data["items"])
    # each image known by its hash too: a decision kept in the browser never passes to another picture
    assert all(d["digest"] == f"{int(d['name'][7:-4]):032x}" for d in data["items"])
    assert [d["accepted"] for d in data["items"]] == [False, False, False, False]  # all under 0.7
    write_review(tmp_path / "none.html", rows, ["a", "b"], per_class=2, threshold=None, max_error=5)
    assert {d["accepted"] for d in page_data((tmp_path / "none.html").read_text())["items"]} == {False}
    write_review(tmp_path / "plain.html", rows, ["a", "b"], per_class=2)
    assert {d["accepted"] for d in page_data((tmp_path / "plain.html").read_text())["items"]} == {None}
    assert data["failed"] == [{"path": str(tmp_path / "broken.png"), "reason": "OSError: truncated"}]
    assert not re.search(r'(src|href)=["\']?(https?:)?//|url\(\s*["\']?https?:', page)  # opens offline


def stray_page(tmp_path):
    """A page of four images of class "a", per_class 2, threshold 0.9: one of them, at 0.99, like no
    class (a blank page the head calls "a"); returns its path."""
    from PIL import Image
    rows = []
    for i, (confidence, ratio) in enumerate([(0.6, 0.9), (0.7, 0.95), (0.99, 2.0), (0.98, 0.8)]):
        Image.new("RGB", (20, 20), (40 * i, 0, 0)).save(tmp_path / f"{i}.png")
        rows.append(Prediction(tmp_path / f"{i}.png", "a", confidence, "b", digest=f"{i:032x}", outlier_ratio=ratio))
    write_review(tmp_path / "r.html", rows, ["a", "b"], per_class=2, threshold=0.9, max_error=5)
    return tmp_path / "r.html"


def test_an_image_like_no_class_is_shown_first_and_never_accepted(tmp_path):
    """The confident image like no class comes first among its class's, however few the page shows,
    marked as such and not accepted at a threshold (0.9) its confidence clears."""
    items = page_data(stray_page(tmp_path).read_text())["items"]
    assert [(d["name"], d["like_no_class"], d["accepted"]) for d in items] == [("2.png", True, False),
                                                                               ("0.png", False, False)]


def test_an_image_like_no_class_is_said_so_on_its_card_in_a_real_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By
    driver, _ = browser
    driver.get(stray_page(tmp_path).as_uri())
    cards = driver.find_elements(By.CSS_SELECTOR, ".card")
    assert ["like no class" in c.text for c in cards] == [True, False], [c.text for c in cards]


def test_a_stream_of_many_rows_gives_the_least_confident_of_each_class_in_turn():
    """3,000 rows in a random order, read once: per class at most per_class kept, then `most` in all
    taken from the classes in turn, each class's least confident first; every row counted."""
    rng = np.random.default_rng(0)
    confidence = rng.permutation(3000) / 3000
    label = np.array(["a", "b", "c"])[np.arange(3000) % 3]
    label[:100] = "c"  # classes of different sizes
    rows = [Prediction(Path(f"{i}.png"), str(label[i]), float(confidence[i]), None) for i in range(3000)]
    shown, counts = least_confident(iter(rows), ["a", "b", "c"], per_class=40, most=100)
    total = {c: int((label == c).sum()) for c in "abc"}
    assert counts == {"a": (34, total["a"]), "b": (33, total["b"]), "c": (33, total["c"])}
    for c in "abc":
        expected = sorted(confidence[label == c])[:counts[c][0]]
        assert [p.confidence for p in shown if p.label == c] == pytest.approx(expected)
    assert [p.label for p in shown] == ["a"] * 34 + ["b"] * 33 + ["c"] * 33

@pytest.mark.slow
def test_review_correct_save_and_apply_in_a_real_browser(trained, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    driver, downloads = browser
    data, ckpt = trained
    folder = tmp_path / "d"
    shutil.copytree(data, folder, ignore=shutil.ignore_patterns("mtlc-cache"))
    odd = folder / "unlabeled" / 'a b, été "q".png'  # saved by the page, read by label.py: CSV quoting both ways
    (folder / "unlabeled" / "u0000.png").rename(odd)
    # Names that end or hide the page's own script unless its data is escaped, and one that is not UTF-8.
    hostile = folder / "unlabeled" / "<!--<script>.png"
    (folder / "unlabeled" / "u0003.png").rename(hostile)
    (folder / "unlabeled" / "<").mkdir()
    (folder / "unlabeled" / "u0006.png").rename(folder / "unlabeled" / "<" / "script>&\u2028y.png")  # .../</script>...
    os.rename(folder / "unlabeled" / "u0009.png", os.fsencode(folder / "unlabeled") + b"/bad\xff.png")
    res = subprocess.run([sys.executable, "evaluate.py", "--ckpt", ckpt, "--data-dir", data, "--predict",
                          folder / "unlabeled", "--max-error", "60", "--review", tmp_path / "review.html", "--csv",
                          tmp_path / "p.csv"], cwd=ROOT, capture_output=True, text=True, errors="surrogateescape",
                         env=dict(os.environ, PYTHONIOENCODING="utf-8:strict"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    rows = {r["path"]: r for r in read_rows((tmp_path / "p.csv").read_text(errors="surrogateescape"), ["accepted"])}
    assert len(rows) == 24 and str(folder / "unlabeled" / "bad\udcff.png") in rows  # the CSV keeps the name's bytes
    assert "1 names are not UTF-8 text and are written as their own bytes" in res.stderr
    assert "23 images shown; 1 listed apart on the page" in res.stderr
    driver.get((tmp_path / "review.html").as_uri())
    cards = driver.find_elements(By.CSS_SELECTOR, ".card")
    assert len(cards) == 23 and all(c.find_element(By.TAG_NAME, "img").get_property("naturalWidth") > 0 for c in cards)
    assert "bad" in driver.find_element(By.ID, "failed").text and "not valid UTF-8" in driver.find_element(By.ID, "failed").text
    groups = {g.get_attribute("data-label") for g in driver.find_elements(By.CSS_SELECTOR, "section.group")}
    assert groups == {r["prediction"] for r in rows.values()}
    for card in cards:  # accepted and uncertain told apart as the CSV says
        accepted = rows[card.get_attribute("data-path")]["accepted"] == "1"
        assert ("accepted" in card.get_attribute("class").split()) == accepted
        assert ("uncertain" in card.get_attribute("class").split()) == (not accepted)

    first = next(c for c in cards if c.get_attribute("data-path") == str(odd))
    second = next(c for c in cards if c.get_attribute("data-path") == str(hostile))
    first_path, second_path = first.get_attribute("data-path"), second.get_attribute("data-path")
    other = next(c for c in ("cat", "dog", "owl") if c != rows[first_path]["prediction"])
    Select(first.find_element(By.TAG_NAME, "select")).select_by_value(other)  # corrected with the chooser
    second.find_element(By.TAG_NAME, "img").click()
    driver.find_element(By.TAG_NAME, "body").send_keys("y")  # confirmed with the keyboard
    assert "2 decided (1 confirmed, 1 corrected)" in driver.find_element(By.ID, "decided").text
    Select(driver.find_element(By.ID, "class-filter")).select_by_value(other)
    assert all(c.is_displayed() == (rows[c.get_attribute("data-path")]["prediction"] == other)
               for c in driver.find_elements(By.CSS_SELECTOR, ".card"))
    saved, labels = save_labels(driver, downloads)
    assert sorted((r["path"], r["label"]) for r in labels) == sorted(
        [(first_path, other), (second_path, rows[second_path]["prediction"])])
    driver.save_screenshot(str(tmp_path / "page.png"))

    applied = run("label.py", "--data-dir", folder, "--apply", saved)
    assert applied.returncode == 0, applied.stderr
    assert (folder / "labeled" / other / Path(first_path).name).is_file() and not Path(first_path).exists()
    assert (folder / "labeled" / rows[second_path]["prediction"] / hostile.name).is_file() and not hostile.exists()
