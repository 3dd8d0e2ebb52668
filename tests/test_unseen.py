"""--predict of a head on a frozen trunk: each image is predicted by one of FOLDS heads trained as the
checkpoint's was, the one that never saw it (an unlabeled training image by the head that left it
out, a held-out image by the head that left it out of its labeled ones, any other by the head its
file's hash picks), calibrated on the held-out images predicted alike; the heads are kept for the
next run; where the training images cannot be had, the checkpoint itself predicts and the line says why."""
import json
import shutil

import numpy as np
import pytest
import torch

import evaluate
import finetune_lc
import train_mt
from conftest import invoke, needs_backbone, read_rows, train_backbone_run
from fakedata import write_own_folder
from mtlc.train import forked, pretrained
from mtlc.train.checkpoints import load_checkpoint, restore_data
from mtlc.train.moved_images import restored_as_now
from mtlc.train.settings import learning_rate
from mtlc.use import classifier, unseen

BACKBONE = "efficientnet-lite0"
pytestmark = needs_backbone(BACKBONE)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("unseen")
    train_backbone_run(root, "--unlabeled-batch", "4", n_labeled=4, n_unlabeled=16, n_test=8)
    assert invoke(finetune_lc, ["--ckpt", root / "run" / "mt.pt", "--epochs", "1", "--decay-epochs", "1"]).exit_code == 0
    return root


@pytest.mark.parametrize("n_checkpoint, n_fold, batch", [(10_000, 7_500, 128), (1_337, 1_002, 128), (12, 9, 6),
                                                        (30, 22, 12)])
def test_a_folds_schedule_takes_as_many_steps_as_the_checkpoints(run, n_checkpoint, n_fold, batch):
    config = load_checkpoint(run / "run" / "lc.pt")["config"]
    config = config.replace(epochs=40, decay_epochs=10, unlabeled_batch=batch,
                            lc=config.lc.replace(epochs=7, decay_epochs=3, mt_step=0))
    per_checkpoint, per_fold = max(1, n_checkpoint // batch), max(1, n_fold // batch)
    fold = unseen.fold_settings(config, n_checkpoint, n_fold, first_steps=50 * per_checkpoint)
    for stage, epochs in (("mt", 50), ("lc", 10)):
        s = fold.stage(stage)
        assert (s.epochs + s.decay_epochs) * per_fold == pytest.approx(epochs * per_checkpoint)
        # the lr a step of the fold's head takes is the one the checkpoint's took at that step
        step = epochs * per_checkpoint - 1
        assert learning_rate(step / per_fold, 1.0, s.epochs, s.decay_epochs) == pytest.approx(
            learning_rate(step / per_checkpoint, 1.0, *((40, 10) if stage == "mt" else (7, 3))))
    assert fold.stage("lc").first_step == 50 * per_checkpoint
    assert fold.eval_every == unseen.NEVER and fold.step_mode == "eager"


def test_each_image_is_predicted_by_the_head_that_never_saw_it(run, monkeypatch, tmp_path):
    state = load_checkpoint(run / "run" / "lc.pt")
    splits, real = {}, unseen.train_fold

    def recorded(state, data, split, device, name, estimate, bar, start=None):
        splits[name] = split
        return real(state, data, split, device, name, estimate, bar, start)
    monkeypatch.setattr(unseen, "train_fold", recorded)
    monkeypatch.setattr(unseen, "cpu_workers", lambda *a: 1)  # recorded in this process
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "p.csv"
    result = invoke(evaluate, ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "unlabeled", "--csv", out,
                               "--json"])
    assert result.exit_code == 0, result.output
    assert "each image is predicted by one of 4 heads" in result.output
    assert "confidences of the 4 heads' teachers calibrated on" in result.output  # their temperature, not the checkpoint's
    assert "training 4 heads as the checkpoint's was" in result.output and "4 heads: " in result.output  # its estimate
    assert result.output.count(" of 4 trained") == 4 and "s/step" not in result.output.replace("s/step on this", "")
    assert json.loads(result.stdout.splitlines()[-1])["unseen_heads"] == 4
    # head k trained on every label, the held-out images but fold k's as labeled ones (after the training
    # rows, with their own labels) and the unlabeled images but fold k's, stage 2 included
    unlabeled, folds = state["unlabeled_idx"], unseen.unlabeled_folds(state)
    assert len(splits) == 4 and np.bincount(folds).tolist() == [4, 4, 4, 4]
    data = restore_data(state, echo=lambda line: None)
    held = unseen.held_out(state, data)
    held_folds = unseen.held_out_folds(state, data, held)
    assert held.source == "test" and len(held.y) == 24 and len(set(held_folds.tolist())) == 4
    n_train = len(data.train_y)
    for k, split in enumerate(splits[f"head {k + 1} of 4"] for k in range(4)):
        rows = split["labeled_idx"]
        assert torch.equal(rows[:len(state["labeled_idx"])], state["labeled_idx"])
        others = [n_train + i for i in np.flatnonzero(held_folds != k)]
        assert sorted(rows[len(state["labeled_idx"]):].tolist()) == others
        assert set(split["unlabeled_idx"].tolist()) == set(unlabeled[torch.from_numpy(folds != k)].tolist())
    training, held_rows = unseen.with_held_out(data, held)
    assert torch.equal(training.train_y[held_rows], held.y)
    assert torch.equal(training.inputs("train")[held_rows][:, 1], data.features.test[held.rows, 0])
    # each unlabeled image's row: the head that left it out, on the image's kept features
    heads = unseen.UnseenHeads.trained(state, data, run / "d", evaluate_key(run), "teacher", None, "cpu", print)
    by_name = {r["path"]: r for r in read_rows(out.read_text(), more=("like_no_class",))}
    assert len(by_name) == 16
    for position, row in enumerate(unlabeled.tolist()):
        head = heads.heads[folds[position]]
        with torch.no_grad():
            logits = head(data.features.train[row:row + 1, 0].float())[1]
        name = str(run / "d" / data.files["train"][row])
        assert by_name[name]["prediction"] == state["config"].classes[int(logits.argmax())]
    # kept: a second run trains no head, and runs no trunk on the checkpoint's own images (their features are kept)
    monkeypatch.setattr(unseen, "train_fold", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(pretrained.PretrainedNet, "features", lambda *a: pytest.fail("the trunk ran"))
    result = invoke(evaluate, ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "test", "--max-error", "60"])
    assert result.exit_code == 0, result.output
    assert result.output.count("kept from before") == 4
    assert "each image was predicted by a head that never saw it" in result.output
    # the Python API gives each image the class and confidence of the CSV where asked for these heads,
    # and says which network answers either way
    import mtlc
    same = mtlc.load(run / "run" / "lc.pt", device="cpu", unseen=True)
    assert same.answers.startswith("4 heads trained as the checkpoint's was")
    for p in same.predict([run / "d" / "unlabeled"]):
        assert (p.label, p.confidence) == (by_name[str(p.path)]["prediction"], float(by_name[str(p.path)]["confidence"]))
    own = mtlc.load(run / "run" / "lc.pt", device="cpu", calibrate=False)
    assert own.unseen is None and own.answers.startswith("the checkpoint's own teacher, which trained on its unlabeled")


@pytest.mark.parametrize("margin", [0.0, 1e9])
def test_an_image_farther_from_the_labeled_ones_than_they_are_apart_is_never_accepted(run, tmp_path, monkeypatch,
                                                                                      margin):
    """Each row says whether the image is like no class (its distance to the labeled images in the
    trunk's features over theirs to each other, above the margin): such a row is never accepted, and
    the run counts them. Margin 0: every image is, and none is accepted; a margin no image reaches: none
    is, and --max-error 99 accepts those its threshold clears."""
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(classifier, "TRUNK_OUTLIER_MARGIN", margin)
    out = tmp_path / "p.csv"
    result = invoke(evaluate, ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "unlabeled", "--max-error",
                               "99", "--csv", out, "--json"])
    assert result.exit_code == 0, result.output
    rows = read_rows(out.read_text(), more=("accepted", "like_no_class"))
    strays = margin == 0.0
    assert len(rows) == 16 and {r["like_no_class"] for r in rows} == {str(int(strays))}
    summary = json.loads(result.stdout.splitlines()[-1])
    accepted = [r["accepted"] for r in rows]
    if strays:
        assert set(accepted) == {"0"} and summary["accepted"] == 0
    else:
        assert accepted == [str(int(float(r["confidence"]) >= summary["threshold"])) for r in rows] and "1" in accepted
    assert summary["like_no_class"] == (16 if strays else 0)
    assert ("16 of them lie farther from the labeled images than those lie from each other" in result.output) == strays
    assert ("like_no_class 1, never accepted" in result.output) == strays
    if strays:  # without --max-error nothing is accepted, so the line does not say "never accepted"
        again = invoke(evaluate, ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "unlabeled"])
        assert "like_no_class 1 (in the checkpoint's own folder" in again.output, again.output


def evaluate_key(run):
    from mtlc.use.classifier import checkpoint_identity
    return checkpoint_identity(run / "run" / "lc.pt")


@pytest.mark.slow
@pytest.mark.parametrize("kept_digests", [True, False])
def test_images_moved_or_renamed_within_the_folder_keep_the_heads_and_their_answers(run, tmp_path, monkeypatch,
                                                                                     kept_digests):
    """The README's loop: --predict, then two unlabeled images moved into labeled/<class>/ (label.py's
    way: the same name) and, where the checkpoint keeps each file's digest, one renamed; the next --predict
    takes the 4 heads up as they were (nothing trains) and gives every image the class and confidence it
    had. A checkpoint from before the digests finds moves by name. An image whose bytes changed: trained again."""
    folder = tmp_path / "d"
    shutil.copytree(run / "d", folder, ignore=shutil.ignore_patterns("mtlc-cache"))
    ckpt = tmp_path / "lc.pt"
    state = torch.load(run / "run" / "lc.pt", weights_only=True)
    assert state["train_digests"].shape == (len(state["config"]["files"]["train"]), 16)
    if not kept_digests:
        del state["train_digests"]
    torch.save(state, ckpt)
    args = ["--ckpt", ckpt, "--predict", folder / "unlabeled", "--data-dir", folder]
    first = invoke(evaluate, [*args, "--csv", tmp_path / "before.csv"])
    assert first.exit_code == 0 and first.output.count(" of 4 trained") == 4, first.output
    before = {r["blake2b"]: r for r in read_rows((tmp_path / "before.csv").read_text(), more=("like_no_class",))}
    images = sorted((folder / "unlabeled").glob("*.png"))
    for image in images[:2]:
        image.rename(folder / "labeled" / state["config"]["classes"][0] / image.name)
    if kept_digests:
        images[2].rename(images[2].with_name("renamed.png"))
    monkeypatch.setattr(unseen, "train_fold", lambda *a, **k: pytest.fail("trained again"))
    again = invoke(evaluate, [*args, folder / "labeled", "--csv", tmp_path / "after.csv"])
    assert again.exit_code == 0 and again.output.count("kept from before") == 4, again.output
    after = read_rows((tmp_path / "after.csv").read_text(), more=("like_no_class",))
    assert len(after) == len(before) - 2 + len(list((folder / "labeled").rglob("*.png")))  # the labeled images too
    for row in after:
        if row["blake2b"] in before:
            assert (row["prediction"], row["confidence"]) == (before[row["blake2b"]]["prediction"],
                                                              before[row["blake2b"]]["confidence"])
    images[3].write_bytes(images[4].read_bytes())  # other bytes under a training image's name
    monkeypatch.undo()
    changed = invoke(evaluate, [*args, "--csv", tmp_path / "changed.csv"])
    assert changed.exit_code == 0 and "the images it trained on are predicted by the checkpoint itself" in changed.output


def test_where_the_training_images_changed_the_checkpoint_predicts_and_says_why(run, tmp_path):
    folder = tmp_path / "d"
    shutil.copytree(run / "d", folder, ignore=shutil.ignore_patterns("mtlc-cache"))
    next(iter(sorted((folder / "unlabeled").glob("*.png")))).unlink()
    result = invoke(evaluate, ["--ckpt", run / "run" / "mt.pt", "--predict", folder / "unlabeled", "--data-dir",
                               folder, "--json", "--csv", tmp_path / "p.csv"])
    assert result.exit_code == 0, result.output
    assert "the images it trained on are predicted by the checkpoint itself" in result.output
    assert "changed since the checkpoint was trained" in result.output
    assert json.loads(result.stdout.splitlines()[-1])["unseen_heads"] == 0


@pytest.mark.parametrize("n_unlabeled, n_test, why", [(8, 0, "it has no held-out images to calibrate heads on"),
                                                      (5, 7, "5 unlabeled images are too few for 4 heads")])
def test_without_held_out_or_enough_unlabeled_images_the_checkpoint_predicts(tmp_path, n_unlabeled, n_test, why):
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=n_unlabeled, n_test=n_test, size=(40, 30))
    args = ["--dataset", "folder", "--data-dir", tmp_path / "d", "--backbone", BACKBONE, "--image-size", "32",
            "--width", "0.25", "--labeled-batch", "6", "--unlabeled-batch", "4", "--epochs", "1", "--decay-epochs",
            "0", "--device", "cpu", "--out", tmp_path / "run"]
    assert invoke(train_mt, args).exit_code == 0
    result = invoke(evaluate, ["--ckpt", tmp_path / "run" / "mt.pt", "--predict", tmp_path / "d" / "unlabeled"])
    assert result.exit_code == 0, result.output
    assert why in result.output and len(read_rows(result.stdout)) == n_unlabeled
    assert "each image is predicted by one of" not in result.output


def test_heads_interrupted_while_one_trains_keep_those_done_and_the_next_run_trains_the_rest(run, monkeypatch,
                                                                                             tmp_path):
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "cache"))
    trained, real = [], unseen.train_fold

    def stopped_in_the_third(state, data, split, device, name, estimate, bar, start=None):
        trained.append(name)
        if len(trained) == 3:
            raise KeyboardInterrupt
        return real(state, data, split, device, name, estimate, bar, start)
    monkeypatch.setattr(unseen, "train_fold", stopped_in_the_third)
    monkeypatch.setattr(unseen, "cpu_workers", lambda *a: 1)  # recorded in this process
    args = ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "unlabeled", "--csv", tmp_path / "p.csv"]
    result = invoke(evaluate, args)
    assert result.exit_code != 0 and "the heads trained so far are kept" in result.output
    assert not (tmp_path / "p.csv").exists()
    trained.clear()
    monkeypatch.setattr(unseen, "train_fold", lambda *a, **k: trained.append(a[4]) or real(*a, **k))
    result = invoke(evaluate, args)
    assert result.exit_code == 0, result.output
    assert trained == ["head 3 of 4", "head 4 of 4"] and result.output.count("kept from before") == 2
    assert "training 2 heads" in result.output
    assert len(read_rows((tmp_path / "p.csv").read_text(), more=("like_no_class",))) == 16


def test_a_link_in_place_of_the_heads_folder_is_refused_in_one_line_and_left_alone(run, monkeypatch, tmp_path):
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("not the tool's")
    monkeypatch.setenv("MTLC_CACHE_DIR", str(cache))
    assert invoke(evaluate, ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "test"]).exit_code == 0
    (folder,) = cache.rglob("unseen-*")
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere)
    result = invoke(evaluate, ["--ckpt", run / "run" / "lc.pt", "--predict", run / "d" / "test", "--csv",
                               tmp_path / "p.csv"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(folder) in result.output and not (tmp_path / "p.csv").exists()
    assert [p.name for p in elsewhere.iterdir()] == ["mine.txt"]


def test_copies_of_one_image_each_keep_a_row_of_their_own():
    """Two training files of the same bytes, one moved: each name takes a row of its own (its own name's
    where that holds its bytes), never one row twice; names outnumbering the rows of their bytes: none."""
    from mtlc.train.moved_images import matched_rows
    hexes = [b"aa" * 16, b"aa" * 16, b"cc" * 16]
    kept = torch.tensor(np.frombuffer(bytes.fromhex(b"".join(hexes).decode()), np.uint8).reshape(3, 16))
    then = ["labeled/cat/x.png", "unlabeled/y.png", "unlabeled/z.png"]
    now = ["labeled/cat/x.png", "labeled/dog/y2.png", "unlabeled/z.png"]
    assert matched_rows(then, now, np.array(hexes, "S32"), kept).tolist() == [0, 1, 2]
    assert matched_rows(then, ["labeled/cat/x.png", "unlabeled/z.png"], np.array([hexes[0], hexes[2]], "S32"),
                        kept) is None


def test_heads_trained_two_at_once_forked_or_spawned_are_those_trained_one_after_another(run, monkeypatch,
                                                                                        tmp_path):
    """On a CPU the heads train one a core, in processes of one thread (train/forked.py), forked on
    Linux and spawned where the platform spawns (macOS, Windows), a spawned one reading the folder
    again: the same heads as one after another in this process, each kept as it ends."""
    state, data = restored_as_now(load_checkpoint(run / "run" / "lc.pt"), run / "d", strong=True)
    threads, heads, lines = torch.get_num_threads(), {}, []
    torch.set_num_threads(1)  # as each worker process's
    try:
        for workers, method in ((1, "fork"), (2, "fork"), (2, "spawn")):
            monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / f"cache{workers}{method}"))
            monkeypatch.setattr(unseen, "cpu_workers", lambda *a, n=workers: n)
            for module in (unseen, forked):
                monkeypatch.setattr(module, "start_method", lambda m=method: m)
            heads[method, workers] = unseen.UnseenHeads.trained(state, data, run / "d", evaluate_key(run), "teacher",
                                                                None, torch.device("cpu"), lines.append)
    finally:
        torch.set_num_threads(threads)
    for method in ("fork", "spawn"):
        for one, other in zip(heads["fork", 1].heads, heads[method, 2].heads):
            assert np.array_equal(unseen.flat(one), unseen.flat(other)), method
    assert sum("; 2 at once" in line for line in lines) == 2
    assert sum(line.endswith(" of 4 trained") for line in lines) == 12
