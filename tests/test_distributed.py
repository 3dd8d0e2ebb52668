"""Several processes (torchrun / DDP) on CPU with gloo: global LC equals one process's LC on the
concatenated batch, the processes stay in sync, and the CLIs run under torchrun."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.multiprocessing as mp

from mtlc.data.datasets import load_digits
from mtlc.data.splits import balanced_split
from mtlc.train.devices import Processes
from mtlc.train import lc as neighbours
from mtlc.train.epochs import fit
from mtlc.train.settings import Stage
from conftest import ROOT, TINY_RUN
from fakedata import tiny_trainer
from kernels import lc_loss

WORLD = 2


def lc_shards(seed, world):
    """Every process's (labeled, unlabeled) features: two clusters, so that eps splits pairs."""
    gen = torch.Generator().manual_seed(seed)
    shards = []
    for _ in range(world):
        zl = torch.randn(6, 8, generator=gen) + 3 * torch.randint(0, 2, (6, 1), generator=gen)
        zu = torch.randn(10, 8, generator=gen) + 3 * torch.randint(0, 2, (10, 1), generator=gen)
        shards.append((zl, zu))
    return shards


def digits_trainer(procs, scope="global", pairs="all", **objective):
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    config = dict(seed=3, labeled_batch=16, unlabeled_batch=64, dataset="digits", num_classes=10, width=0.0625,
                  bn_momentum=0.02, mean=[0.2] * 3, std=[0.3] * 3, precision="fp32", **objective)
    stage = Stage(name="lc", epochs=1, decay_epochs=0, lr=0.05, ema=0.9, cons_weight=10.0, cons_rampup=1,
                  eval_every=5, first_step=0, lc_eps=2.0, lc_weight=5.0, lc_rampup=0, lc_pairs=pairs, lc_scope=scope)
    return tiny_trainer(data, labeled, unlabeled, config, stage, procs)


def worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        zl, zu = (t.double().requires_grad_() for t in lc_shards(seed=1, world=world)[rank])
        loss = lc_loss(torch.cat(dist_nn.all_gather(zl)), torch.cat(dist_nn.all_gather(zu)), 2.0)
        loss.backward()
        # The trainer's own LC path: what reaches the loss, and the loss, in each scope.
        calls, classes_seen = [], []

        def recording_lc_loss(z_labeled, z_unlabeled, eps, **kwargs):
            loss, fraction = lc_loss(z_labeled, z_unlabeled, eps, **kwargs)
            calls.append(torch.tensor([len(z_labeled), len(z_unlabeled), loss.item()], dtype=torch.float64))
            classes_seen.append(kwargs.get("classes"))
            return loss, fraction
        neighbours.lc_loss = recording_lc_loss
        seen = {}
        for scope, pairs in (("local", "all"), ("global", "same-prediction"), ("global", "all")):
            calls.clear()
            classes_seen.clear()
            trainer = digits_trainer(Processes(rank, world), scope, pairs)
            stats = [trainer.train_step(step, *trainer.batches.views(step)) for step in range(3)]
            seen[scope if pairs == "all" else "global-classes"] = torch.stack(calls)
            if pairs != "all":  # every rank's labels, then every rank's predictions, as z is gathered
                labels = [trainer.batches.views(step)[2] for step in range(3)]
                seen["classes"] = torch.stack(classes_seen)
                seen["own_labels"] = torch.stack(labels)
        # The pseudo-label objective's adaptive threshold: updated with the mean over every rank's batch.
        pseudo = digits_trainer(Processes(rank, world), consistency="fixmatch", threshold="adaptive",
                                pseudo_labels="student", cons_weight=1.0)
        for step in range(3):
            pseudo.train_step(step, *pseudo.batches.views(step))
        seen["threshold"] = torch.cat([pseudo.objective.confidence.view(1), pseudo.objective.class_means])
        # An epoch of fit, which ends in an evaluation (the BN statistics recomputed) and checkpoints.
        (Path(out_dir) / "fit").mkdir(exist_ok=True)
        fit(trainer, Path(out_dir) / "fit", {}, echo=lambda line: None)
        torch.save(dict(lc=loss.detach(), grad_l=zl.grad, grad_u=zu.grad, stats=torch.stack(stats), seen=seen,
                        student=trainer.student.state_dict(), teacher=trainer.teacher.state_dict()),
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_global_lc_and_processes_in_sync(tmp_path):
    mp.spawn(worker, args=(WORLD, tmp_path / "init", tmp_path), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]

    # Global LC: the loss of one process on the concatenated batch, on every rank. Each rank's
    # backward sums the gradient over the ranks' identical losses (world x the single-process one);
    # DDP's average over the ranks then gives exactly the single-process gradient.
    shards = lc_shards(seed=1, world=WORLD)
    zl, zu = (torch.cat([s[i] for s in shards]).double().requires_grad_() for i in (0, 1))
    single = lc_loss(zl, zu, 2.0)
    single.backward()
    assert 0 < single.item()
    for r, got in enumerate(ranks):
        torch.testing.assert_close(got["lc"], single.detach(), rtol=1e-12, atol=0)
        torch.testing.assert_close(got["grad_l"] / WORLD, zl.grad[6 * r:6 * (r + 1)], rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(got["grad_u"] / WORLD, zu.grad[10 * r:10 * (r + 1)], rtol=1e-10, atol=1e-14)

    # The trainer's global scope: both ranks compute the loss of the whole global batch (16 labeled
    # and 64 unlabeled images, as configured), the same on both; the local scope sees each rank's half.
    for r in range(WORLD):
        assert ranks[r]["seen"]["global"][:, :2].tolist() == [[16, 64]] * 3
        assert ranks[r]["seen"]["local"][:, :2].tolist() == [[8, 32]] * 3
    torch.testing.assert_close(ranks[0]["seen"]["global"][:, 2], ranks[1]["seen"]["global"][:, 2], rtol=1e-6, atol=0)
    # Same-prediction pairs in the global scope: the class ids gathered in z's order, alike on every rank.
    assert torch.equal(ranks[0]["seen"]["classes"], ranks[1]["seen"]["classes"])
    classes = ranks[0]["seen"]["classes"]
    assert classes.shape == (3, 80)
    for r in range(WORLD):  # each rank's 8 labeled images in rank order
        assert torch.equal(classes[:, 8 * r:8 * (r + 1)], ranks[r]["seen"]["own_labels"])
    assert ranks[0]["seen"]["global-classes"][:, :2].tolist() == [[16, 64]] * 3
    assert not torch.allclose(ranks[0]["seen"]["local"][:, 2], ranks[1]["seen"]["local"][:, 2], rtol=1e-3)

    # The adaptive threshold moved from 1/C alike on every rank.
    assert torch.equal(ranks[0]["seen"]["threshold"], ranks[1]["seen"]["threshold"])
    assert ranks[0]["seen"]["threshold"][0] != 0.1

    # After training steps and an epoch of fit: student, teacher and the BN running means (recomputed
    # at fit's evaluation) identical on every rank.
    assert torch.isfinite(ranks[0]["stats"]).all() and (ranks[0]["stats"][:, 3] > 0).all()  # LC acted
    for model in ("student", "teacher"):
        for key, value in ranks[0][model].items():
            assert torch.equal(value, ranks[1][model][key]), (model, key)


def torchrun(*args):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={WORLD}", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.mark.slow
def test_stages_under_torchrun(tmp_path):
    tiny = [*TINY_RUN, "--unlabeled-batch", "256", "--precision", "fp32"]
    res = torchrun("train_mt.py", *tiny, "--epochs", "1", "--decay-epochs", "1", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("mt epoch 1/2") == 1  # only rank 0 prints and writes
    ckpt = torch.load(tmp_path / "mt.pt", weights_only=True)
    assert ckpt["config"]["processes"] == WORLD and ckpt["epoch"] == 1

    res = torchrun("finetune_lc.py", "--ckpt", tmp_path / "mt.pt", "--eps", "3", "--lam", "2", "--lc-scope", "global",
                   "--epochs", "1", "--decay-epochs", "0", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in (tmp_path / "lc_metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["lc"] > 0 and "teacher_error" in records[0]

    res = torchrun("train_mt.py", *tiny, "--labeled-batch", "33")
    assert res.returncode != 0 and "does not split evenly over 2 processes" in res.stderr
