"""Every output of one --predict run holds what the run says it chose: with --suggest N, the CSV,
the review page and Label Studio's tasks all hold the N images to label next."""
import json
import re

import evaluate
from conftest import invoke, read_rows


def test_suggest_with_a_review_page_and_label_studio_holds_the_chosen_images(trained, tmp_path):
    data, ckpt = trained
    result = invoke(evaluate, ["--ckpt", ckpt, "--predict", data / "unlabeled", "--suggest", "3", "--csv",
                               tmp_path / "next.csv", "--review", tmp_path / "page.html", "--label-studio",
                               tmp_path / "tasks.json"])
    assert result.exit_code == 0, result.output
    chosen = {r["path"] for r in read_rows((tmp_path / "next.csv").read_text(), ["cluster"])}
    assert len(chosen) == 3 and "3 images shown" in result.output
    page = (tmp_path / "page.html").read_text()
    shown = {name for name in re.findall(r"u\d{4}\.png", page)}
    assert shown == {path.rsplit("/", 1)[-1] for path in chosen}, shown
    assert len(json.loads((tmp_path / "tasks.json").read_text())) == 3
    result = invoke(evaluate, ["--ckpt", ckpt, "--predict", data / "unlabeled", "--suggest", "3", "--review",
                               tmp_path / "only.html"])
    assert result.exit_code == 0 and "3 images shown" in result.output, result.output
