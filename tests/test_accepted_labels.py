"""Images label.py --accepted labeled are a model's predictions: the log tells them from a person's
labels (action accept), and train_mt.py trains on them as unlabeled images unless
--accepted-as-labels; a person's relabel or confirmation (a same-label row) since, or a file replaced
by hand, makes the label a person's."""
import csv
import json
import io

import pytest
import torch

import evaluate
import label
import train_mt
from conftest import invoke, write_labels
from fakedata import write_own_folder
from mtlc.data.files import file_digest
from mtlc.data.splits import by_model, own_split
from mtlc.label import apply as labeling
from mtlc.label.log import label_history, log_rows

TINY = ["--dataset", "folder", "--backbone", "convlarge", "--width", "0.0625", "--lr", "0.01", "--precision", "fp32",
        "--labeled-batch", "6", "--unlabeled-batch", "6", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu"]


def accept(folder, tmp_path, rows):
    """label.py --apply --accepted of a predictions CSV accepting `rows` [(unlabeled/ path, class)]."""
    preds = tmp_path / "preds.csv"
    preds.write_text("path,prediction,confidence,runner_up,accepted\n"
                     + "".join(f"{folder / path},{c},0.99,cat,1\n" for path, c in rows))
    result = invoke(label, ["--data-dir", folder, "--apply", preds, "--accepted"])
    assert result.exit_code == 0, result.output
    return result


def trained_split(folder, out, *extra):
    result = invoke(train_mt, [*TINY, "--data-dir", folder, "--out", out, *extra])
    assert result.exit_code == 0, result.output
    state = torch.load(out / "mt_final.pt", weights_only=True)
    names = state["config"]["files"]["train"]
    return result, {part: {names[i] for i in state[part].tolist()} for part in ("labeled_idx", "unlabeled_idx")}


def test_accepted_images_train_as_unlabeled_ones_unless_asked(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    said = accept(folder, tmp_path, [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")]).output
    assert "trains on them as unlabeled images" in said
    again = accept(folder, tmp_path, [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")]).output
    assert "nothing to move: all 2 rows" in again  # accepting again confirms nothing: no person gave those labels
    assert [r["action"] for r in log_rows(folder) if r["action"] != "mkdir"] == ["accept", "accept"]
    result, split = trained_split(folder, tmp_path / "r")
    assert "2 images in" in result.output and "they train as unlabeled images" in result.output
    assert {"labeled/cat/u0000.png", "labeled/dog/u0001.png"} <= split["unlabeled_idx"]
    assert not split["labeled_idx"] & {"labeled/cat/u0000.png", "labeled/dog/u0001.png"}
    assert len(split["labeled_idx"]) == 9 and len(split["unlabeled_idx"]) == 12
    result, split = trained_split(folder, tmp_path / "r2", "--accepted-as-labels")
    assert "--accepted-as-labels: 2 images" in result.output and len(split["labeled_idx"]) == 11
    assert torch.load(tmp_path / "r2" / "mt_final.pt", weights_only=True)["config"]["accepted_as_labels"] is True


def test_a_persons_relabel_or_an_undo_ends_a_models_label(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")])
    moved = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("labeled/cat/u0000.png", "owl")])])
    assert moved.exit_code == 0, moved.output
    assert label_history(folder).accepted.keys() == {"labeled/dog/u0001.png"}
    assert invoke(label, ["--data-dir", folder, "--undo"]).exit_code == 0  # the relabel undone: the model's again
    assert label_history(folder).accepted.keys() == {"labeled/cat/u0000.png", "labeled/dog/u0001.png"}
    assert invoke(label, ["--data-dir", folder, "--undo"]).exit_code == 0  # the acceptance undone: unlabeled again
    assert label_history(folder).accepted == {}


def test_a_file_replaced_by_hand_is_a_persons_and_an_unlogged_hash_a_models():
    names = ["labeled/cat/0.png", "labeled/cat/u0.png", "labeled/dog/u1.png", "unlabeled/u2.png"]
    digests = [file_digest(bytes([i])).encode() for i in range(4)]
    accepted = {"labeled/cat/u0.png": file_digest(b"another image"), "labeled/dog/u1.png": None}
    assert by_model(names, digests, accepted).tolist() == [False, False, True, False]
    accepted["labeled/cat/u0.png"] = file_digest(bytes([1]))
    assert by_model(names, digests, accepted).tolist() == [False, True, True, False]
    labels = torch.tensor([0, 0, 1, -1])
    labeled, unlabeled, val = own_split(labels, 0, 0, unlabeled_too=by_model(names, digests, accepted))
    assert labeled.tolist() == [0] and unlabeled.tolist() == [1, 2, 3] and not len(val)


def test_a_class_taught_only_by_accepted_predictions_is_refused(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "cat")])
    for name in ("0.png", "1.png", "2.png"):
        (folder / "labeled" / "cat" / name).unlink()  # the person's labels of cat gone
    result = invoke(train_mt, [*TINY, "--data-dir", folder, "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "holds only images label.py --accepted labeled" in result.output
    assert "--accepted-as-labels" in result.output and not (tmp_path / "r" / "mt_final.pt").exists()


def test_accepted_as_labels_without_an_own_images_folder_is_refused(tmp_path):
    result = invoke(train_mt, ["--dataset", "digits", "--accepted-as-labels", "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "--accepted-as-labels goes with a folder of your own images" in result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("row, message", [
    ("1,t,accept,labeled/cat/0.png,labeled/dog/0.png,dog,", "under unlabeled/"),
    ("1,t,confirm,labeled/cat/0.png,labeled/dog/0.png,dog,", "a confirmation names one labeled/ image"),
    ("1,t,confirm,unlabeled/u0000.png,unlabeled/u0000.png,cat,", "a confirmation names one labeled/ image"),
])
def test_a_crafted_accept_or_confirm_row_is_refused(tmp_path, row, message):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=6)
    (folder / "label-log.csv").write_text(f"batch,time,action,source,target,label,blake2b\n{row}\n")
    result = invoke(train_mt, [*TINY, "--data-dir", folder, "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "line 2 cannot be trusted" in result.output and message in result.output


def test_a_copy_accepted_under_another_class_is_a_label_conflict_only_where_trained_as_a_label(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    (folder / "unlabeled" / "copy.png").write_bytes((folder / "labeled" / "cat" / "0.png").read_bytes())
    accept(folder, tmp_path, [("unlabeled/copy.png", "dog")])
    result, _ = trained_split(folder, tmp_path / "r")
    assert "copies of one under another class" not in result.output
    result, _ = trained_split(folder, tmp_path / "r2", "--accepted-as-labels")
    assert "1 labeled or test images are copies of one under another class" in result.output


def test_a_persons_same_label_confirms_a_models_and_undo_takes_it_back(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")])
    labels = write_labels(tmp_path / "l.csv", [("labeled/cat/u0000.png", "cat"), ("labeled/cat/0.png", "cat"),
                                               ("unlabeled/u0003.png", "owl")])
    dry = invoke(label, ["--data-dir", folder, "--apply", labels, "--dry-run"])
    assert dry.exit_code == 0 and "labeled/cat/u0000.png: confirm cat" in dry.output, dry.output
    assert "would move 1 image into labeled/ (owl 1); would confirm 1 label label.py --accepted gave" in dry.output
    result = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert result.exit_code == 0 and "moved 1 image into labeled/ (owl 1); confirmed 1 label" in result.output
    assert "(1 applied before, skipped)" in result.output  # the person's own label, labeled so already
    confirms = [r for r in log_rows(folder) if r["action"] == "confirm"]
    assert [(r["source"], r["target"], r["label"]) for r in confirms] == [("labeled/cat/u0000.png",) * 2 + ("cat",)]
    assert label_history(folder).accepted.keys() == {"labeled/dog/u0001.png"}
    _, split = trained_split(folder, tmp_path / "r")
    assert "labeled/cat/u0000.png" in split["labeled_idx"] and "labeled/dog/u0001.png" in split["unlabeled_idx"]
    again = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert again.exit_code == 0 and "were applied before" in again.output  # confirmed once
    undone = invoke(label, ["--data-dir", folder, "--undo"])
    assert undone.exit_code == 0 and "put back the 1 images of batch 2 where they were; took back the 1 confirmations" in undone.output
    assert label_history(folder).accepted.keys() == {"labeled/cat/u0000.png", "labeled/dog/u0001.png"}
    assert (folder / "unlabeled" / "u0003.png").exists()


def test_a_batch_refused_midway_leaves_its_confirmations_untaken(tmp_path, monkeypatch):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "cat")])

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(labeling, "rename_no_replace", full_disk)
    labels = write_labels(tmp_path / "l.csv", [("labeled/cat/u0000.png", "cat"), ("unlabeled/u0003.png", "owl")])
    result = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert result.exit_code == 1 and "the 0 images moved before it were put back; nothing was moved" in result.output
    assert label_history(folder).accepted.keys() == {"labeled/cat/u0000.png"}  # the batch undone, confirmation too
    assert (folder / "unlabeled" / "u0003.png").exists() and (folder / "labeled" / "cat" / "u0000.png").exists()


def test_the_audit_doubts_an_accepted_label_the_next_teacher_disagrees_with(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=6, n_unlabeled=30)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "owl"), ("unlabeled/a/u0001.png", "dog")])  # u0000 is a cat
    run = tmp_path / "r"
    result = invoke(train_mt, [*TINY[:-6], "--data-dir", folder, "--epochs", "20", "--decay-epochs", "0", "--device", "cpu",
                               "--out", run])
    assert result.exit_code == 0, result.output
    audit = invoke(evaluate, ["--ckpt", run / "mt_final.pt", "--audit", tmp_path / "a.csv", "--audit-steps", "20"])
    assert audit.exit_code == 0, audit.output
    rows = {r["path"]: r for r in csv.DictReader(io.StringIO((tmp_path / "a.csv").read_text())) if r["kind"] == "label"}
    doubted = rows[str(folder / "labeled" / "owl" / "u0000.png")]
    assert doubted["suggestion"] == "cat" and "label.py --accepted" in doubted["detail"]
    assert str(folder / "labeled" / "dog" / "u0001.png") not in rows  # its label is right


def test_the_pool_error_leaves_out_accepted_images_whose_label_is_a_models(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    truth = tmp_path / "truth.csv"
    truth.write_text("path,class\n" + "".join(f"{p.relative_to(folder).as_posix()},{('cat', 'dog', 'owl')[int(p.stem[1:]) % 3]}\n"
                                              for p in sorted((folder / "unlabeled").rglob("*.png"))))
    accept(folder, tmp_path, [("unlabeled/u0000.png", "owl"), ("unlabeled/a/u0001.png", "dog")])
    trained_split(folder, tmp_path / "r")
    result = invoke(evaluate, ["--ckpt", tmp_path / "r" / "mt_final.pt", "--pool-error", "--truth", truth, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1])["n_pool"] == 10  # unlabeled/'s; not u0000 (labeled owl: a model's)


def test_an_accepted_image_relabeled_counts_as_relabeled_and_never_goes_to_val_as_a_models(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=24)
    rows = [(f"unlabeled/{'' if i % 3 == 0 else 'a/' if i % 3 == 1 else 'a/b/'}u{i:04d}.png", ("cat", "dog", "owl")[i % 3])
            for i in range(12)]
    accept(folder, tmp_path, rows)
    moved = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("labeled/cat/u0000.png", "dog")])])
    assert moved.exit_code == 0, moved.output
    assert label_history(folder).relabeled == ["labeled/dog/u0000.png"]  # a model's label relabeled (the audit's, say)
    for flag in ((), ("--accepted-as-labels",)):
        result = invoke(train_mt, [*TINY, "--data-dir", folder, "--val", "6", "--out", tmp_path / f"r{len(flag)}", *flag])
        assert result.exit_code == 0, result.output
        state = torch.load(tmp_path / f"r{len(flag)}" / "mt_final.pt", weights_only=True)
        val = {state["config"]["files"]["train"][i] for i in state["val_idx"].tolist()}
        assert len(val) == 6 and all(name.split("/")[-1][0] != "u" or name == "labeled/dog/u0000.png" for name in val)
        assert len(state["labeled_idx"]) + len(val) == 9 + 1 + 11 * bool(flag)


def test_a_row_naming_an_accepted_images_old_path_confirms_it_or_says_where_it_is(tmp_path):
    """A review page saved before label.py --accepted ran names unlabeled/ paths: the same class
    confirms the accepted image where it is now; another class is refused, naming its new path."""
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")])
    same = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "s.csv", [("unlabeled/u0000.png", "cat")])])
    assert same.exit_code == 0 and "confirmed 1 label" in same.output and "--undo takes it back" in same.output
    undone = invoke(label, ["--data-dir", folder, "--undo"])
    assert undone.exit_code == 0 and undone.output.strip() == ("took back the 1 confirmations of batch 2 (label.py "
                                                               "--accepted's labels again)")
    assert invoke(label, ["--data-dir", folder, "--apply", tmp_path / "s.csv"]).exit_code == 0
    assert label_history(folder).accepted.keys() == {"labeled/dog/u0001.png"}
    other = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "o.csv", [("unlabeled/a/u0001.png", "owl")])])
    assert other.exit_code == 2 and "a row for its new path relabels it" in other.output
    assert "labeled/dog/u0001.png" in other.output


def test_an_accepted_file_replaced_by_hand_trains_as_a_persons_label(tmp_path):
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    accept(folder, tmp_path, [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")])  # rows without a hash
    logged = {r["target"]: r["blake2b"] for r in log_rows(folder) if r["action"] == "accept"}
    assert logged["labeled/cat/u0000.png"] == file_digest((folder / "labeled" / "cat" / "u0000.png").read_bytes())
    (folder / "labeled" / "cat" / "u0000.png").write_bytes((folder / "labeled" / "cat" / "0.png").read_bytes())
    result, split = trained_split(folder, tmp_path / "r")
    assert "1 images in" in result.output and "labeled/cat/u0000.png" in split["labeled_idx"]
    assert "labeled/dog/u0001.png" in split["unlabeled_idx"]


def test_a_models_label_for_an_image_a_person_labeled_otherwise_is_passed_over(tmp_path):
    """The README's order: a person's labels first, then the accepted predictions, some of them for the
    same images: where the person gave another class (or set the image aside) the prediction is
    skipped and counted, the person's label stands, and the rest move."""
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=3, n_unlabeled=12)
    mine = write_labels(tmp_path / "mine.csv", [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "dog")])
    assert invoke(label, ["--data-dir", folder, "--apply", mine]).exit_code == 0
    said = accept(folder, tmp_path, [("unlabeled/u0000.png", "dog"), ("unlabeled/a/u0001.png", "dog"),
                                     ("unlabeled/u0003.png", "owl")]).output
    assert "moved 1 image" in said and "(1 applied before, skipped)" in said
    assert "(1 labeled otherwise or set aside by you before, skipped: yours stand)" in said
    assert (folder / "labeled" / "cat" / "u0000.png").exists() and (folder / "labeled" / "owl" / "u0003.png").exists()
    again = accept(folder, tmp_path, [("unlabeled/u0000.png", "dog")]).output
    assert "nothing to move: of the 1 rows" in again and "1 name images you labeled otherwise" in again
    # a person's own second file that contradicts their first is still refused, naming where the image is
    result = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "again.csv",
                                                                          [("unlabeled/u0000.png", "dog")])])
    assert result.exit_code == 2 and "label.py labeled 'cat' it before" in result.output
