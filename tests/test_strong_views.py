"""FixMatch's strong views embedded ahead on a frozen trunk (train_mt.py --strong-views): the trunk's
features of RandAugment + Cutout views of each training image, computed once and kept in their own
sealed work beside the weak views' (which they leave as they were), the same views on any run; the
student's unlabeled images take one of them; the option goes only with FixMatch on a frozen trunk,
and stage 2 (as --resume) and --predict's heads that never saw an image take the kept views up again."""
import shutil

import pytest
import torch

import evaluate
import finetune_lc
import train_mt
from conftest import BACKBONE_RUN, invoke, needs_backbone
from fakedata import write_own_folder
from mtlc.data import batches as batches_module
from mtlc.data.batches import Batches
from mtlc.data.datasets import load_dataset
from mtlc.data.views import feature_views
from mtlc.train import checkpoints, embeddings, pretrained
from mtlc.train.checkpoints import load_checkpoint

BACKBONE = "efficientnet-lite0"


def embedded(backbone_folder, strong_views):
    data = load_dataset("folder", backbone_folder / "d", 32, echo=lambda line: None)
    return data, embeddings.embed(data, backbone_folder / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None,
                                  strong_views=strong_views)


@needs_backbone(BACKBONE)
def test_strong_views_are_fixmatchs_views_embedded_once_and_the_same_on_any_run(backbone_folder, monkeypatch):
    data, weak = embedded(backbone_folder, 0)
    assert weak.strong is None
    _, both = embedded(backbone_folder, 2)
    assert both.strong.shape == (len(data.train_y), 2, 1280)
    assert torch.equal(both.train, weak.train) and torch.equal(both.test, weak.test)  # the weak views as they were
    assert not torch.equal(both.strong[:, 0], both.strong[:, 1])
    assert not torch.equal(both.strong[:, 0], weak.train[:, 0])
    # the trunk's features of each image's strong views, drawn from its own key: in another order (as
    # after label.py's moves), with other images beside it, the same
    keys = embeddings.image_keys(data, "train")
    order = torch.arange(len(keys)).flip(0)[:5]
    inputs = embeddings.strong_inputs(data.train_x[order], 2, keys[order.numpy()], 32, pretrained.BACKBONES[BACKBONE])
    engine = pretrained.TrunkEngine(BACKBONE, "cpu")
    for view in range(2):
        torch.testing.assert_close(both.strong[order, view].float(), engine(inputs[view]), rtol=2e-3, atol=2e-3)
    monkeypatch.setattr(embeddings, "compute", lambda *a: pytest.fail("computed again"))
    assert torch.equal(embedded(backbone_folder, 2)[1].strong, both.strong)
    monkeypatch.undo()
    shutil.rmtree(backbone_folder / "d" / "mtlc-cache" / f"embed-{BACKBONE}-32px-strong2")
    assert torch.equal(embedded(backbone_folder, 2)[1].strong, both.strong)  # the same views computed again


def test_the_students_unlabeled_images_take_a_strong_view_embedded_ahead():
    torch.manual_seed(0)
    x, strong_rows = torch.randn(10, 2, 8), torch.randn(6, 3, 8)
    student, teacher = feature_views(x, 4, True, strong_rows)
    assert all(any(torch.equal(student[4 + i], view) for view in strong_rows[i]) for i in range(6))
    assert all(any(torch.equal(s, view) for view in rows) for s, rows in zip(student[:4], x[:4]))
    assert all(any(torch.equal(t, view) for view in rows) for t, rows in zip(teacher, x))
    dropped, _ = feature_views(x, 4, True)  # none kept: the weak view with half its features dropped
    assert (dropped[4:] == 0).float().mean() > 0.3 and not (dropped[:4] == 0).any()


@pytest.mark.parametrize("options, why", [
    ([*BACKBONE_RUN, "--consistency", "mt"], "this run trains mt"),
    (["--dataset", "folder", "--backbone", "convlarge", "--consistency", "fixmatch", "--device", "cpu"],
     "on convlarge")])
def test_strong_views_go_only_with_fixmatch_on_a_frozen_trunk(tmp_path, options, why):
    write_own_folder(tmp_path / "d", n_labeled=2, n_unlabeled=4, n_test=1, size=(40, 30))
    args = [*options, "--strong-views", "2", "--data-dir", tmp_path / "d", "--out", tmp_path / "run"]
    result = invoke(train_mt, args)
    assert result.exit_code == 2 and why in result.output and "leave --strong-views out" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run" / "mt.pt").exists()


@needs_backbone(BACKBONE)
def test_a_run_with_strong_views_trains_and_stage_two_and_the_unseen_heads_take_them_up(backbone_folder, tmp_path,
                                                                                       monkeypatch):
    run = tmp_path / "run"
    args = [*BACKBONE_RUN, "--consistency", "fixmatch", "--strong-views", "2", "--unlabeled-batch", "6",
            "--data-dir", backbone_folder / "d", "--out", run]
    result = invoke(train_mt, args)
    assert result.exit_code == 0, result.output
    assert "2 strong views embedded ahead" in result.output
    state = load_checkpoint(run / "mt.pt")
    assert state["config"].strong_views == 2
    # the training step's student: each unlabeled image in one of its strong views
    assert checkpoints.restore_data(state, echo=lambda line: None).features.strong is None  # not for predicting
    data = checkpoints.restore_data(state, echo=lambda line: None, strong=True)
    batches = Batches(data, checkpoints.checkpoint_split(state), state["config"], torch.device("cpu"), strong_view=True)
    student, _, _ = batches.views(0)
    unlabeled = batches.indices(0)[batches.n_lab:].tolist()
    assert all(any(torch.equal(student[batches.n_lab + i], view.float()) for view in data.features.strong[j])
               for i, j in enumerate(unlabeled))
    taken = []
    monkeypatch.setattr(embeddings, "compute", lambda *a: pytest.fail("computed again"))
    monkeypatch.setattr(checkpoints, "embed",
                        lambda *a, **k: taken.append(k["strong_views"]) or embeddings.embed(*a, **k))
    result = invoke(finetune_lc, ["--ckpt", run / "mt.pt", "--epochs", "1", "--decay-epochs", "1"])
    assert result.exit_code == 0, result.output
    assert taken == [2]
    # --predict's heads that never saw an image train as the run did: on the strong views kept
    given = []
    monkeypatch.setattr(batches_module, "feature_views",
                        lambda x, n, strong, rows=None: given.append(rows is not None)
                        or feature_views(x, n, strong, rows))
    result = invoke(evaluate, ["--ckpt", run / "mt.pt", "--predict", backbone_folder / "d" / "unlabeled",
                               "--max-error", "5", "--csv", tmp_path / "p.csv"])
    assert result.exit_code == 0 and "one of 4 heads" in result.output, result.output
    assert given and all(given)


@needs_backbone(BACKBONE)
def test_the_graphed_step_takes_the_strong_views_too(tmp_path, monkeypatch):
    write_own_folder(tmp_path / "d", n_labeled=2, n_unlabeled=6, n_test=1, size=(40, 30))
    given = []
    monkeypatch.setattr(batches_module, "feature_views",
                        lambda x, n, strong, rows=None: given.append(rows is not None)
                        or feature_views(x, n, strong, rows))
    result = invoke(train_mt, [*BACKBONE_RUN, "--consistency", "fixmatch", "--strong-views", "2", "--step-mode", "graphed",
                               "--unlabeled-batch", "6", "--data-dir", tmp_path / "d", "--out", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    assert given and all(given)
