"""Is my folder right? The audit's parts against planted faults: near copies found at the cache's
size and unrelated images left alone, images like no class, doubtful labels scored out of sample,
the CSV contract; training's line about test images copied from training and the error without
them; label.py moving a labeled or test image to the class it more likely is."""
import csv
import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import evaluate
import label
from conftest import invoke, run, save_labels, snapshot, write_labels
from fakedata import run_settings, write_own_folder
from mtlc.use.audit import AUDIT_HEADER, KINDS, outlier_findings
from mtlc.use.outliers import LabeledSpread, distance_ratios, outlier_scores
from mtlc.use.selection import unit_rows
from mtlc.use import audit as audit_module
from mtlc.data import nearest
from mtlc.data.copies import copies_in, leaked_test, near_pairs
from mtlc.data.datasets import ImageData
from mtlc.data.files import file_digest
from mtlc.train.inference import at_chance
from mtlc.use.crossfit import fold_config
from mtlc.train.settings import learning_rate
from mtlc.data.images import decode


def photo(seed, size=(48, 40)):
    """A smooth random image (as photos are: neighbouring pixels alike), RGB."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    return Image.fromarray(small).resize(size, Image.BICUBIC)


@pytest.mark.parametrize("size", [32, 260])
def test_near_copies_are_found_and_unrelated_images_left_alone(tmp_path, size, monkeypatch):
    """A copy resized to 80% and saved as a JPEG of quality 70, and one with its brightness moved, are
    found at the cache's size (a pretrained trunk's 260 px compared at COMPARE_SIDE, never at more);
    60 unrelated photos pair with nothing."""
    from mtlc.data import copies
    sides, real = [], copies.compared
    monkeypatch.setattr(copies, "compared", lambda x: sides.append(real(x).shape[-1]) or real(x))
    paths = []
    for i in range(60):
        paths.append(tmp_path / f"{i}.png")
        photo(i).save(paths[-1])
    original = Image.open(paths[7])
    original.resize((38, 32), Image.BILINEAR).save(tmp_path / "resized.jpg", quality=70)
    Image.eval(original, lambda v: min(255, v + 20)).save(tmp_path / "brighter.png")
    paths += [tmp_path / "resized.jpg", tmp_path / "brighter.png"]
    images = torch.stack([decode(p, size) for p in paths])
    assert sorted((i, j) for i, j, _ in near_pairs(images)) == [(7, 60), (7, 61), (60, 61)]
    found = copies_in(images[60:], images[:60])
    assert [(i, j) for i, j, _ in found] == [(0, 7), (1, 7)]
    assert set(sides) == {min(size, copies.COMPARE_SIDE)}


def test_flat_images_copy_only_flat_images_of_their_own_colour():
    """A white page and a black one standardize alike (nothing varies): they are no copies of each
    other; two white pages (one a shade off) are; a flat image is no copy of a photo, a dark one
    beside the black page included."""
    flat = [Image.new("RGB", (40, 40), colour) for colour in ((255, 255, 255), (0, 0, 0), (250, 250, 250), (200, 30, 30))]
    photos = [np.array(photo(i).resize((32, 32))) for i in range(20)]
    photos[0] //= 16  # dark: values 0-15
    images = torch.stack([torch.from_numpy(np.array(im.resize((32, 32)))).permute(2, 0, 1) for im in flat]
                         + [torch.from_numpy(p).permute(2, 0, 1) for p in photos])
    assert [(i, j) for i, j, _ in near_pairs(images)] == [(0, 2)]


def test_an_image_like_no_class_is_an_outlier():
    """Three classes of smooth images in three colours; one image far from them in features, one in
    pixels only (the network's features say nothing of it): both found, no other image."""
    torch.manual_seed(0)
    centres = torch.eye(4)[:3] * 5
    n_labeled, n_unlabeled = 10, 20
    features = torch.cat([c + 0.3 * torch.randn(n, 4) for n in (n_labeled, n_unlabeled) for c in centres])
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]
    images = torch.stack([torch.from_numpy(np.array(photo(k, (32, 32)))).permute(2, 0, 1) // 4 +
                          torch.tensor(colours[(k // n) % 3], dtype=torch.uint8)[:, None, None] // 4 * 3
                          for n in (n_labeled, n_unlabeled) for k in range(3 * n)])
    far_in_features = torch.tensor([[0.0, 0.0, 0.0, 5.0]])
    stripes = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    stripes[..., ::2, :] = 255  # a pattern no class has, its features those of a class
    features = torch.cat([features, far_in_features, centres[:1]])
    images = torch.cat([images, images[:1], stripes])
    mask = np.arange(len(features)) < 3 * n_labeled
    found = outlier_findings([f"i{k}" for k in range(len(features))], features, images, mask)
    assert sorted(f.path for f in found) == [f"i{len(features) - 2}", f"i{len(features) - 1}"]
    assert all(f.score > 1 for f in found)


def test_a_trunks_features_count_at_their_own_margin():
    """An unlabeled image about 1.07 times as far from the labeled ones as they are from each other:
    no outlier at the network's margin (1.25), one at a pretrained trunk's (1.05); features given as
    nearest.Vectors (the trunk's kept features, read a batch at a time)."""
    rng = np.random.default_rng(0)
    angles = np.concatenate([rng.uniform(0, 0.5, 20), [0.52]])  # on a circle: unit features
    features = np.stack([np.cos(angles), np.sin(angles)], 1).astype(np.float32)
    images = torch.from_numpy(np.stack([np.asarray(photo(0, (32, 32)))] * len(angles))).permute(0, 3, 1, 2)
    labeled = np.arange(len(angles)) < 20
    scores = outlier_scores(nearest.in_memory(features), images, labeled)
    assert 1.05 < scores[-1] < 1.25
    assert outlier_findings(list(map(str, range(21))), nearest.in_memory(features), images, labeled) == []
    found = outlier_findings(list(map(str, range(21))), nearest.in_memory(features), images, labeled, feature_margin=1.05)
    assert [f.path for f in found] == ["20"]


def test_without_images_only_the_features_count():
    """A trunk's audit leaves the thumbnails out: an image whose thumbnail lies far from the labeled
    ones (as plain sky among busy photos) while its features lie among theirs is no outlier."""
    rng = np.random.default_rng(1)
    features = rng.normal(size=(21, 8)).astype(np.float32)
    ramp = np.linspace(0, 255, 32)[None, None, None, :] + rng.normal(0, 8, (21, 3, 32, 32))
    images = torch.from_numpy(ramp.clip(0, 255).astype(np.uint8))  # alike: one gradient, a little noise
    images[-1] = torch.from_numpy(rng.integers(0, 256, (3, 32, 32), dtype=np.uint8))  # its thumbnail far from theirs
    features[-1] = features[0] + 0.01  # in features, next to a labeled image
    labeled = np.arange(21) < 20
    with_thumbnails = outlier_scores(nearest.in_memory(features), images, labeled, feature_margin=1.05)
    alone = outlier_scores(nearest.in_memory(features), None, labeled, feature_margin=1.05)
    assert with_thumbnails[-1] > 1.25 > alone[-1]
    found = outlier_findings(list(map(str, range(21))), nearest.in_memory(features), None, labeled, feature_margin=1.05)
    assert found == []


def test_predict_measures_a_new_image_as_the_audit_measures_the_folders_own():
    """LabeledSpread (--predict's) gives an image outside the labeled set the ratio the audit's
    distance_ratios gives it among the folder's images: the same neighbours, the same unit."""
    rng = np.random.default_rng(3)
    features = rng.normal(size=(60, 8)).astype(np.float32)
    labeled = np.arange(60) < 25
    expected = distance_ratios(nearest.in_memory(unit_rows(features)), labeled)[~labeled]
    np.testing.assert_allclose(LabeledSpread(nearest.in_memory(unit_rows(features[labeled]))).ratios(features[~labeled]), expected, rtol=1e-5)


@pytest.mark.parametrize("right, said", [(0.25, "no better than"), (0.45, "cannot be told"), (0.6, None),
                                         (0.9, None)])
def test_cross_fitted_networks_at_chance_are_said(right, said):
    """Four classes, the first a third of the labels (chance level: 66.7% error), 120 images. Networks
    right on 25% make the audit say they are no better than chance (more steps); on 45%, within two
    standard errors of it, that chance cannot be ruled out (more labels); on 60% or 90% nothing."""
    labels = np.repeat([0, 1, 2, 3], [40, 30, 30, 20])
    rng = np.random.default_rng(0)
    predicted = np.where(rng.random(len(labels)) < right, labels, (labels + rng.integers(1, 4, len(labels))) % 4)
    logits = torch.nn.functional.one_hot(torch.from_numpy(predicted), 4).float()
    lines = []
    audit_module.warn_at_chance(logits, labels, 600, lines.append)
    assert len(lines) == (said is not None) and all(said in line for line in lines), lines
    assert all(("--audit-steps more than 600" in line) == (said == "no better than") for line in lines), lines


def test_few_labels_right_on_all_are_not_at_chance():
    """Two labels a class, all right: no warning (two standard errors of chance reach 0% here); a
    hold-out of one class (`--val 1`) has no chance level to be at."""
    lines = []
    audit_module.warn_at_chance(torch.eye(2).repeat(2, 1), np.array([0, 1, 0, 1]), 600, lines.append)
    assert lines == []
    assert at_chance(25.0, [0, 1, 0, 1]) and not at_chance(0.0, [0, 1, 0, 1])
    assert not at_chance(100.0, [2]) and not at_chance(100.0, [2, 2, 2])


@pytest.mark.parametrize("n_unlabeled", [100, 1_000_000])
def test_the_fold_schedule_is_the_steps_asked_whatever_the_folder(n_unlabeled):
    """200 steps at 10 images a step: on 100 unlabeled images and on a million alike, the lr stays
    full for 160 steps, decays to 0 at step 200, and the consistency ramp ends at step 40."""
    config = run_settings(unlabeled_batch=10, epochs=999, decay_epochs=99, eval_every=5, cons_rampup=300.0)
    fold = fold_config(config, n_unlabeled=n_unlabeled, steps=200)
    per_epoch = n_unlabeled // 10
    lr = [learning_rate(step / per_epoch, 1.0, fold.epochs, fold.decay_epochs) for step in (159, 180, 200)]
    assert lr == pytest.approx([1.0, 0.5, 0.0]) and fold.cons_rampup * per_epoch == pytest.approx(40)


def smooth_images(n, seed=0):
    """n smooth random images (3, 32, 32), as photos are: neighbouring pixels alike."""
    rng = np.random.default_rng(seed)
    small = torch.from_numpy(rng.integers(0, 256, (n, 3, 6, 5), dtype=np.uint8)).float()
    return torch.nn.functional.interpolate(small, size=32, mode="bicubic").clamp(0, 255).round().to(torch.uint8)


def test_copies_among_ten_thousand_images_are_found_by_the_approximate_index(monkeypatch):
    """With the search made approximate (an inverted-file index, 32 cells probed 16 at a time), 40
    copies planted among 10,000 smooth images (the same pixels, or brighter by 20) are all found, and
    nothing else; test images copied from training are leaks at the start of training alike."""
    monkeypatch.setattr(nearest, "EXACT_PAIRS", 0)
    images = smooth_images(10_000)
    originals = np.arange(0, 8_000, 200)
    copies = images[originals].clone()
    copies[1::2] = (copies[1::2].int() + 20).clamp(max=255).to(torch.uint8)
    everything = torch.cat([images, copies])
    found = {(i, j) for i, j, _ in near_pairs(everything)}
    assert found == {(int(o), 10_000 + k) for k, o in enumerate(originals)}
    test = torch.cat([copies[:5], smooth_images(20, seed=1)])
    data = ImageData(images, torch.zeros(10_000, dtype=torch.long), test, torch.zeros(25, dtype=torch.long), ["a"],
                     files=dict(train=[f"u{i}" for i in range(10_000)], test=[f"t{i}" for i in range(25)]))
    assert leaked_test(data) == ["t0", "t1", "t2", "t3", "t4"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """A learnable folder (each class its own colour) with a labeled image filed under the wrong
    class, a test image copied into unlabeled/, an unlabeled image copied within unlabeled/ and a
    stray image of no class; an MT checkpoint trained on it."""
    root = tmp_path_factory.mktemp("audit")
    folder = root / "d"
    write_own_folder(folder, n_labeled=8, n_unlabeled=48, n_test=8)
    (folder / "labeled" / "cat" / "3.png").rename(folder / "labeled" / "owl" / "cat3.png")
    shutil.copyfile(folder / "test" / "dog" / "2.png", folder / "unlabeled" / "leaked.png")
    shutil.copyfile(folder / "unlabeled" / "u0003.png", folder / "unlabeled" / "a" / "again.png")
    Image.fromarray(np.full((30, 40, 3), (0, 255, 0), np.uint8)).save(folder / "unlabeled" / "stray.png")
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--consistency", "mt", "--data-dir", folder, "--width", "0.125", "--labeled-batch", "12",
              "--unlabeled-batch", "16", "--lr", "0.02", "--cons-weight", "10", "--epochs", "8", "--decay-epochs", "2",
              "--device", "cpu", "--out", root / "run")
    assert res.returncode == 0, res.stderr
    return folder, root / "run" / "mt_final.pt", res


@pytest.mark.slow
def test_training_says_which_test_images_are_copies_and_the_error_without_them(faulty):
    folder, ckpt, res = faulty
    assert "1 of the 24 test images are also in labeled/ or unlabeled/" in res.stdout
    assert "test without its copies of training images error" in res.stdout
    state = torch.load(ckpt, weights_only=True)
    assert state["config"]["leaked_test"] == ["test/dog/2.png"]
    result = run("evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled", "--json", "--csv", folder.parent / "p.csv")
    assert result.returncode == 0 and '"n_held_out": 23' in result.stdout  # calibrated without the copied one


@pytest.mark.slow
def test_a_test_set_made_only_of_copies_is_said_and_training_goes_on(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=4, n_unlabeled=12, n_test=0)
    for c in ("cat", "dog", "owl"):
        (folder / "test" / c).mkdir(parents=True)
        shutil.copyfile(folder / "labeled" / c / "0.png", folder / "test" / c / "copy.png")
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", folder, "--width", "0.125", "--epochs", "1",
              "--decay-epochs", "0", "--labeled-batch", "6", "--unlabeled-batch", "6", "--device", "cpu",
              "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert "every one of the 3 test images is also in labeled/ or unlabeled/" in res.stdout


@pytest.fixture(scope="module")
def audited(faulty, tmp_path_factory):
    """evaluate.py --audit of the faulty folder's checkpoint: (folder, its CSV rows, its review page, the run)."""
    folder, ckpt, _ = faulty
    out = tmp_path_factory.mktemp("audited")
    res = run("evaluate.py", "--ckpt", ckpt, "--audit", out / "audit.csv", "--audit-folds", "2",
              "--audit-steps", "60", "--review", out / "audit.html")
    assert res.returncode == 0, res.stderr
    return folder, list(csv.DictReader(io.StringIO((out / "audit.csv").read_text()))), out / "audit.html", res


@pytest.mark.slow
def test_the_audit_finds_what_was_planted(audited):
    folder, rows, page, res = audited
    assert tuple(rows[0]) == AUDIT_HEADER
    assert [r["kind"] for r in rows] == sorted((r["kind"] for r in rows), key=KINDS.index)
    for kind in KINDS:
        scores = [float(r["score"]) for r in rows if r["kind"] == kind]
        assert scores == sorted(scores, reverse=True)
    by_name = {(r["kind"], r["path"].split("/d/")[-1]): r for r in rows}
    assert by_name[("label", "labeled/owl/cat3.png")]["suggestion"] == "cat"
    assert by_name[("label", "labeled/owl/cat3.png")]["given"] == "owl"
    assert by_name[("leak", "test/dog/2.png")]["suggestion"].endswith("unlabeled/leaked.png")
    copies = {frozenset((r["path"].split("/d/")[-1], r["suggestion"].split("/d/")[-1])) for r in rows if r["kind"] == "duplicate"}
    assert frozenset(("unlabeled/u0003.png", "unlabeled/a/again.png")) in copies
    assert ("outlier", "unlabeled/stray.png") in by_name
    assert all(line in res.stderr for line in ("doubtful labels", "duplicates", "test images that are also", "like no class"))


@pytest.mark.slow
def test_a_doubtful_label_is_fixed_with_one_key_in_a_real_browser(audited, browser):
    """The audit's page as a person uses it: the doubtful label shown with its given class and the
    suggested one, 'y' confirms the suggestion, the leak's box sets it aside, Save writes labels.csv
    (each row bound to its image's hash), label.py moves the image to the suggested class and the leak
    into set-aside/, and --undo puts both back; the copies and the stray are listed."""
    from selenium.webdriver.common.by import By
    driver, downloads = browser
    folder, rows, page, _ = audited
    before = snapshot(folder)
    driver.get(page.as_uri())
    card = next(c for c in driver.find_elements(By.CSS_SELECTOR, ".card")
                if c.get_attribute("data-path").endswith("labeled/owl/cat3.png"))
    assert "labeled owl" in card.text and "cat?" in card.text
    card.find_element(By.TAG_NAME, "img").click()
    driver.find_element(By.TAG_NAME, "body").send_keys("y")
    findings = driver.find_element(By.ID, "findings").text
    assert "leak: " in findings and "duplicate: " in findings and "stray.png" in findings
    leak = next(f for f in driver.find_elements(By.CSS_SELECTOR, ".finding.leak")
                if f.get_attribute("data-path").endswith("test/dog/2.png"))
    leak.find_element(By.CSS_SELECTOR, "input.aside").click()
    assert "1 set aside" in driver.find_element(By.ID, "decided").text
    saved, rows_saved = save_labels(driver, downloads)
    digest = file_digest((folder / "labeled" / "owl" / "cat3.png").read_bytes())
    assert rows_saved == [
        {"path": card.get_attribute("data-path"), "label": "cat", "blake2b": digest, "action": "label"},
        {"path": leak.get_attribute("data-path"), "label": "", "blake2b": file_digest((folder / "test" / "dog" / "2.png").read_bytes()),
         "action": "set-aside"}]
    res = invoke(label, ["--data-dir", folder, "--apply", saved])
    assert res.exit_code == 0 and (folder / "labeled" / "cat" / "cat3.png").is_file(), res.output
    assert (folder / "set-aside" / "test" / "dog" / "2.png").is_file() and not (folder / "test" / "dog" / "2.png").exists()
    assert invoke(label, ["--data-dir", folder, "--undo"]).exit_code == 0
    assert snapshot(folder) == before


def test_label_py_relabels_a_labeled_and_a_test_image(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=3, n_unlabeled=6, n_test=3)
    folder = tmp_path / "d"
    before = snapshot(folder)
    rows = [("labeled/cat/1.png", "dog"), ("test/owl/0.png", "cat"), ("labeled/dog/0.png", "dog")]  # the last: so already
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows)])
    assert res.exit_code == 0 and "moved 2 images" in res.output and "1 applied before" in res.output, res.output
    assert (folder / "labeled" / "dog" / "1.png").is_file() and (folder / "test" / "cat" / "0.png").is_file()
    assert "put back the 2 images" in invoke(label, ["--data-dir", folder, "--undo"]).output
    assert snapshot(folder) == before
    refused = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "m.csv", [("test/owl/0.png", "zebra")]),
                             "--new-classes"])
    assert refused.exit_code == 2 and "a test image can only take a class labeled/ has" in refused.output


def test_audit_needs_one_checkpoint_and_an_image_folder(tmp_path):
    assert invoke(evaluate, ["--review", tmp_path / "r.html", "--ckpt", tmp_path / "x.pt"]).exit_code == 2
    res = invoke(evaluate, ["--audit", tmp_path / "a.csv", "--ckpt", tmp_path / "a.pt", "--ckpt", tmp_path / "b.pt"])
    assert res.exit_code == 2 and "--audit takes exactly one --ckpt" in res.output
    same = invoke(evaluate, ["--audit", tmp_path / "a.csv", "--review", tmp_path / "a.csv", "--ckpt", tmp_path / "a.pt"])
    assert same.exit_code == 2 and "name the same file" in same.output
    as_json = invoke(evaluate, ["--audit", tmp_path / "a.csv", "--json", "--ckpt", tmp_path / "a.pt"])
    assert as_json.exit_code == 2 and "not with --audit or --onnx" in as_json.output
    per_class = invoke(evaluate, ["--audit", tmp_path / "a.csv", "--review", tmp_path / "r.html", "--review-per-class",
                                  "3", "--ckpt", tmp_path / "a.pt"])
    assert per_class.exit_code == 2 and "--review-per-class goes with --predict" in per_class.output
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_test_images_relabeled_with_label_py_count_as_errors_in_calibration(tmp_path):
    """Two test images relabeled with label.py (as from the audit's suggestion), then trained on: the
    run says so and records them, and --max-error's calibration counts them as errors."""
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=4, n_unlabeled=12, n_test=8)
    rows = [("test/dog/0.png", "cat"), ("test/owl/1.png", "cat")]
    assert invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows)]).exit_code == 0
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", folder, "--width", "0.125", "--epochs", "1",
              "--decay-epochs", "0", "--labeled-batch", "6", "--unlabeled-batch", "6", "--device", "cpu", "--out", tmp_path / "r")
    assert res.returncode == 0 and "2 images were relabeled with label.py" in res.stdout, res.stderr
    assert torch.load(tmp_path / "r" / "mt_final.pt", weights_only=True)["config"]["relabeled"] == [
        "test/cat/0-1.png", "test/cat/1-1.png"]
    summary = run("evaluate.py", "--ckpt", tmp_path / "r" / "mt_final.pt", "--predict", folder / "unlabeled", "--max-error",
                  "50", "--json", "--csv", tmp_path / "p.csv")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout.splitlines()[-1])["relabeled_counted_wrong"] == 2


@pytest.mark.slow
def test_an_audit_interrupted_goes_on_from_the_parts_it_kept(faulty, tmp_path, monkeypatch):
    """An audit killed in its copy search (here: it raises) keeps its folds and the teacher's
    outputs beside the CSV; the same command again trains no fold, and writes what an audit never
    interrupted writes; nothing is left beside the CSV."""
    _, ckpt, _ = faulty
    args = ["--ckpt", ckpt, "--audit-folds", "2", "--audit-steps", "20", "--audit"]
    real = audit_module.copy_findings
    monkeypatch.setattr(audit_module, "copy_findings", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    first = invoke(evaluate, args + [tmp_path / "a.csv"])
    assert isinstance(first.exception, RuntimeError) and "the same command goes on from there" in first.output
    monkeypatch.setattr(audit_module, "copy_findings", real)
    again = invoke(evaluate, args + [tmp_path / "a.csv"])
    assert again.exit_code == 0 and "fold 1 of 2: kept from before" in again.output, again.output
    assert "fold 2 of 2: kept from before" in again.output and "steps at" not in again.output
    whole = invoke(evaluate, args + [tmp_path / "b.csv"])
    assert whole.exit_code == 0 and (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv"]


def test_the_teachers_features_are_read_a_batch_at_a_time_their_pages_let_go(tmp_path):
    """The audit keeps the teacher's features of every image (1 GB at a million images of 256 values)
    mapped: the outlier search's passes leave no pages of the file resident."""
    from conftest import resident_bytes
    from mtlc.data.mapped import mapped_work_rows
    from mtlc.data.nearest import in_memory
    from mtlc.disk.work import Work
    work = Work(tmp_path / "audit", dict(step="audit"))
    rows = np.random.default_rng(0).normal(size=(20_000, 128)).astype(np.float32)
    work.appended("features.f32").write(rows.tobytes())
    work.commit(force=True)
    vectors = in_memory(mapped_work_rows(work, "features.f32", np.float32, 128))
    assert np.array_equal(np.concatenate(list(vectors.batches())), rows)
    assert np.array_equal(vectors.rows(np.array([3, 19_999])), rows[[3, 19_999]])
    assert resident_bytes(tmp_path / "audit" / "features.f32") < 2 * 2 ** 20


def test_labeled_images_that_are_all_copies_give_no_spread_to_measure_in():
    """Two labeled images that are one image: every new image would be infinitely far in their units;
    none is measured instead."""
    same = np.ones((2, 8), np.float32)
    assert LabeledSpread(nearest.in_memory(same)).largest is None
    assert LabeledSpread(nearest.in_memory(np.eye(3, 8, dtype=np.float32))).largest > 0
