"""The three stages end to end on tiny data: files, metrics lines, JSON keys, exit codes."""
import json

import pytest
import torch

from mtlc.train.lc import MIN_LOSS_UNIT
from mtlc.train.checkpoints import CHECKPOINT_KEYS
from mtlc.use.figures import stage_label
import evaluate
import finetune_lc
import train_mt
from conftest import ROOT, TINY_RUN, invoke, overriding, run
from fakedata import lines

# TINY: digits at 16 x 16 pixels (the digits are 8 x 8): a quarter of the default 32's compute, for the runs
# that check files, lines and exit codes rather than what is learned.
TINY = [*TINY_RUN, "--unlabeled-batch", "256", "--epochs", "1", "--decay-epochs", "1", "--seed", "1"]


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mt")
    res = run("train_mt.py", "--dataset", "digits", *TINY, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "mt epoch 2/2" in res.stdout and "test error student" in res.stdout
    return out


@pytest.mark.slow
def test_three_stages_on_digits(mt_run, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("mt.pt", "mt_final.pt", "mt_metrics.jsonl"):
        (out / name).write_bytes((mt_run / name).read_bytes())
    for name in ("mt.pt", "mt_final.pt", "mt_metrics.jsonl"):
        assert (out / name).stat().st_size > 0
    records = lines(out / "mt_metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    assert {"loss", "ce", "cons", "lr", "cons_weight", "time_s", "step"} <= set(records[0])
    assert "student_error" in records[-1]

    ckpt = torch.load(out / "mt.pt", weights_only=True)
    assert set(CHECKPOINT_KEYS) <= set(ckpt) and ckpt["epoch"] == 1 and ckpt["stage"] == "mt"
    assert torch.load(out / "mt_final.pt", weights_only=True)["epoch"] == 2

    lc = run("finetune_lc.py", "--ckpt", out / "mt.pt", "--device", "cpu", "--eps", "3", "--lam", "2", "--epochs", "1",
             "--decay-epochs", "1", "--lc-rampup", "1")
    assert lc.returncode == 0, lc.stderr
    records = lines(out / "lc_metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[0]["lc"] > 0 and 0 < records[0]["neighbour_fraction"] <= 1
    lc_ckpt = torch.load(out / "lc.pt", weights_only=True)
    assert lc_ckpt["stage"] == "lc" and lc_ckpt["step"] == 2 * ckpt["step"] + ckpt["step"]
    assert torch.equal(lc_ckpt["labeled_idx"], ckpt["labeled_idx"])  # the MT split is reused

    ev = run("evaluate.py", "--ckpt", out / "lc.pt", "--json")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert {"student_error", "teacher_error", "n_test", "dataset", "labels"} <= set(result)
    assert result["dataset"] == "digits" and result["labels"] == 100 and result["n_test"] == 360
    assert result["teacher_error"] == pytest.approx(records[-1]["teacher_error"])


def test_a_dataset_without_file_names_records_its_test_set_as_not_checked(mt_run):
    """digits has no files to look through for copies: None, never the [] of 'none found'."""
    assert torch.load(mt_run / "mt.pt", weights_only=True)["config"]["leaked_test"] is None


def test_refuses_to_overwrite(mt_run):
    before = (mt_run / "mt.pt").read_bytes()
    result = invoke(train_mt, ["--dataset", "digits", *TINY, "--out", mt_run])
    assert result.exit_code == 2 and "--overwrite" in result.output
    assert (mt_run / "mt.pt").read_bytes() == before


def test_a_new_stage_one_takes_the_old_stage_two_with_it(tmp_path):
    """lc.pt beside the mt.pt it continued: a new stage 1 in the folder refuses without --overwrite,
    and with it leaves no stage 2 of the replaced run for evaluate.py to report."""
    (tmp_path / "lc.pt").write_bytes(b"an earlier stage 2")
    result = invoke(train_mt, ["--dataset", "digits", *TINY, "--out", tmp_path])
    assert result.exit_code == 2 and "already holds lc.pt of an earlier run" in result.output
    result = invoke(train_mt, ["--dataset", "digits", *TINY, "--overwrite", "--out", tmp_path])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mt.pt").exists() and not (tmp_path / "lc.pt").exists()


@pytest.mark.parametrize("args, message", [
    (["--eps", "0"], "0.0 is not in the range x>0"),
    (["--eps", "-1"], "-1.0 is not in the range x>0"),
    (["--eps", "nan"], "'nan' is not a finite number"),
    (["--eps", "inf"], "'inf' is not a finite number"),
    (["--lam", "-1"], "--lam must be finite and >= 0"),
    (["--eps", "often"], "'often' is neither a number nor 'auto'"),
    (["--eps-scale", "log"], "Invalid value for '--eps-scale'"),
])
def test_finetune_bad_input(mt_run, tmp_path, args, message):
    result = invoke(finetune_lc, ["--ckpt", mt_run / "mt.pt", *args, "--out", tmp_path / "lc"])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "lc").exists()


def test_bad_checkpoints(mt_run, tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"junk")
    torch.save({"student": {}}, tmp_path / "foreign.pt")
    truncated = (mt_run / "mt.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(truncated[: len(truncated) // 2])
    for name, message in [("missing.pt", "does not exist"), ("junk.pt", "cannot load"),
                          ("truncated.pt", "cannot load"), ("foreign.pt", "not a checkpoint of this project")]:
        for command in (finetune_lc, evaluate):
            result = invoke(command, ["--ckpt", tmp_path / name])
            assert result.exit_code == 2 and message in result.output, (name, result.output)
            assert "Traceback" not in result.output


def test_finetune_refuses_an_lc_checkpoint(mt_run, tmp_path):
    state = torch.load(mt_run / "mt.pt", weights_only=True)
    state["stage"] = "lc"
    state["config"]["lc"] = dict(eps=2.0, eps_auto=False, eps_scale="fixed", start={}, lam=1.0, lc_rampup=1.0, epochs=1,
                                 decay_epochs=0, lr=0.05, eval_every=1, mt_step=0, mt_checkpoint=str(mt_run / "mt.pt"))
    torch.save(state, tmp_path / "lc.pt")
    result = invoke(finetune_lc, ["--ckpt", tmp_path / "lc.pt"])
    assert result.exit_code == 2 and "not a Mean Teacher checkpoint" in result.output


@pytest.mark.parametrize("script", [train_mt, finetune_lc, evaluate])
def test_help(script):
    res = invoke(script, ["--help"])
    assert res.exit_code == 0 and "--device" in res.output


@pytest.mark.parametrize("script", sorted(str(p.relative_to(ROOT)) for folder in ("tools", "examples")
                                         for p in (ROOT / folder).glob("*.py") if "__main__" in p.read_text()))
def test_every_tool_and_example_starts_from_the_checkout(script):
    """As the docs show them (python tools/x.py, from the project's root, nothing installed): each finds the
    project by itself and explains its options."""
    res = run(script, "--help")
    assert res.returncode == 0 and len(res.stdout.splitlines()) > 3 and res.stderr == "", res.stderr


@pytest.mark.slow
def test_same_seed_same_weights_on_cpu(mt_run, tmp_path):
    res = run("train_mt.py", "--dataset", "digits", *TINY, "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    a = torch.load(mt_run / "mt_final.pt", weights_only=True)
    b = torch.load(tmp_path / "mt_final.pt", weights_only=True)
    for model in ("student", "teacher"):
        assert all(torch.equal(a[model][k], b[model][k]) for k in a[model])


def test_evaluate_several_checkpoints(mt_run):
    """Two checkpoints of one run at two epochs are evaluated each, and kept apart: no mean over them
    (runs averaged differ in their seeds only: tests/test_alike_runs.py)."""
    result = invoke(evaluate, ["--ckpt", mt_run / "mt.pt", "--ckpt", mt_run / "mt_final.pt", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.strip().splitlines()]
    assert len(rows) == 2 and rows[0]["alike"] != rows[1]["alike"] and all("teacher_error" in r for r in rows)
    text = invoke(evaluate, ["--ckpt", mt_run / "mt.pt", mt_run / "mt_final.pt"]).output  # one --ckpt, two files
    assert text.count("digits, 100 labels, MT") == 2 and "mean +- std over" not in text, text


@pytest.mark.slow
def test_results_table_curves_and_tsne(mt_run, tmp_path):
    ckpts = ["--ckpt", mt_run / "mt.pt", "--ckpt", mt_run / "mt_final.pt"]
    result = invoke(evaluate, [*ckpts, "--table", tmp_path / "t.md", "--tsne", tmp_path / "tsne.png",
                               "--tsne-points", 300])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "t.md").read_text()
    assert "| method | digits, 100 labels [epoch 1] | digits, 100 labels [epoch 2] |" in table, table
    assert "| MT | " in table and "(1) |" in table
    assert (tmp_path / "tsne.png").read_bytes()[:4] == b"\x89PNG"
    result = invoke(evaluate, [*ckpts, "--table", tmp_path / "t.csv"])
    header, *rows = (tmp_path / "t.csv").read_text().splitlines()
    assert header.startswith("method,setting,runs") and [r[:r.index("]") + 4] for r in rows] == [
        'MT,"digits, 100 labels [epoch 1]",1', 'MT,"digits, 100 labels [epoch 2]",1']
    result = invoke(evaluate, ["--curves", mt_run / "mt_metrics.jsonl", "--plot", tmp_path / "c.png"])
    assert result.exit_code == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (["--curves", "README.md"], "--curves goes with --plot"),
    (["--table", "x.txt", "--ckpt", "a.pt"], "must end in .md or .csv"),
    ([], "nothing to do"),
])
def test_evaluate_bad_input(args, message):
    result = invoke(evaluate, args)
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize("change, message", [
    (lambda s: s["model_args"].update(width=0.25), "does not fit this project's model"),
    (lambda s: s.pop("model_args") and s["config"].update(width=0.25), "does not fit this project's model"),  # an old run
    (lambda s: s["config"].update(num_classes=7, classes=s["config"]["classes"][:7]), "10 outputs do not fit its 7 classes"),
    (lambda s: s["config"].update(num_classes=7), "do not fit its class count"),
    (lambda s: s["config"].update(dataset="svhn", data_dir="/nonexistent", image_size=32), "SVHN files missing"),
])
def test_incompatible_checkpoint(mt_run, tmp_path, monkeypatch, change, message):
    import torchvision
    monkeypatch.setattr(torchvision.datasets, "SVHN", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    state = torch.load(mt_run / "mt.pt", weights_only=True)
    change(state)
    torch.save(state, tmp_path / "odd.pt")
    for command in (evaluate, finetune_lc):
        result = invoke(command, ["--ckpt", tmp_path / "odd.pt", "--out", tmp_path / "o"] if command is finetune_lc
                        else ["--ckpt", tmp_path / "odd.pt"])
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.slow
def test_eps_auto_is_chosen_printed_and_stored(mt_run, tmp_path):
    res = run("finetune_lc.py", "--ckpt", mt_run / "mt.pt", "--eps", "auto", "--eps-scale", "relative", "--epochs", "1",
              "--decay-epochs", "0", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    lc = torch.load(tmp_path / "lc.pt", weights_only=True)["config"]["lc"]
    assert lc["eps_auto"] is True and lc["eps_scale"] == "relative" and lc["eps"] > 0
    assert lc["eps_ratio"] == pytest.approx(lc["eps"] / lc["start"]["d2_mean"])
    # the relative loss is unit-free, but never divided by less than MIN_LOSS_UNIT (a barely trained net)
    assert lc["loss_unit"] == max(lc["start"]["d2_mean"], MIN_LOSS_UNIT)
    start = lc["start"]
    assert start["eps"] == lc["eps"] and 0 < start["neighbour_fraction"] <= 1
    assert f"eps {lc['eps']:.4g} (auto, relative" in res.stdout
    assert f"neighbour fraction of {start['neighbour_fraction']:.3f} at LC's start" in res.stdout
    record = lines(tmp_path / "lc_metrics.jsonl")[-1]
    # the sample's fraction over every LC pair beside the epoch's own (the mean over its steps of the pairs LC kept)
    assert {"d2_same_median", "d2_different_median", "d2_ratio", "d2_mean", "eps", "d2_neighbour_fraction",
            "neighbour_fraction"} <= set(record)


@pytest.mark.slow
@pytest.mark.parametrize("zeroed, message", [((".g", ".bias"), "features have collapsed"),
                                             ((".v",), "features are not finite")])
def test_a_collapsed_stage_one_ends_stage_two_in_one_line(mt_run, tmp_path, zeroed, message):
    """A network that learned nothing (every gain and bias 0: every image's features the same, every
    distance 0) leaves LC nothing to cluster, and one whose features are NaN (weight norm of a zero
    direction) nothing to measure: exit 2, said, no traceback (the eps summary divided by zero)."""
    state = torch.load(mt_run / "mt.pt", weights_only=True)
    for net in ("student", "teacher"):
        state[net] = {k: torch.zeros_like(v) if k.endswith(zeroed) else v for k, v in state[net].items()}
    torch.save(state, tmp_path / "collapsed.pt")
    res = run("finetune_lc.py", "--ckpt", tmp_path / "collapsed.pt", "--epochs", "1", "--decay-epochs", "0",
              "--out", tmp_path / "lc")
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.slow
def test_all_neighbours_is_reported(mt_run, tmp_path):
    """eps above every distance: said at LC's start, once for the epochs, and in the metrics."""
    res = run("finetune_lc.py", "--ckpt", mt_run / "mt.pt", "--eps", "1e6", "--eps-scale", "fixed", "--lc-pairs", "all",
              "--lam", "0.1", "--epochs", "2", "--decay-epochs", "0", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "every LC pair is a neighbour at LC's start" in res.stderr
    assert res.stderr.count("every LC pair was a neighbour in every step of epoch 1") == 1
    assert "epoch 2" not in res.stderr  # logged once
    assert [r["all_neighbours"] for r in lines(tmp_path / "lc_metrics.jsonl")] == [True, True]
    # LC's control (lambda2 0) uses no neighbours: measured, not warned of
    res = run("finetune_lc.py", "--ckpt", mt_run / "mt.pt", "--eps", "1e6", "--eps-scale", "fixed", "--lc-pairs", "all",
              "--lam", "0", "--epochs", "1", "--decay-epochs", "0", "--out", tmp_path / "control")
    assert res.returncode == 0 and "every LC pair" not in res.stderr, res.stderr
    assert lines(tmp_path / "control" / "lc_metrics.jsonl")[-1]["all_neighbours"] is True
    # evaluate.py on a stage-2 checkpoint from before LC's first evaluation (a resume checkpoint)
    state = torch.load(tmp_path / "lc.pt", weights_only=True)
    state["metrics"] = state["metrics"][:1]
    torch.save(state, tmp_path / "early.pt")
    result = invoke(evaluate, ["--ckpt", tmp_path / "early.pt", "--json"])
    assert result.exit_code == 0 and "d2_ratio_end" not in result.output, result.output


def test_distances_plot_and_json(mt_run, tmp_path):
    result = invoke(evaluate, ["--ckpt", mt_run / "mt.pt", "--distances", tmp_path / "d2.png"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "d2.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["d2_ratio"] == pytest.approx(summary["d2_same_median"] / summary["d2_different_median"])
    assert summary["eps"] > 0 and 0 < summary["neighbour_fraction"] <= 1


class CreatesAFile:
    """Unpickling this object opens (creates) a file: what a hostile checkpoint could do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def test_checkpoints_cannot_run_code(mt_run, tmp_path):
    marker = tmp_path / "ran"
    state = torch.load(mt_run / "mt.pt", weights_only=True)
    state["config"]["note"] = CreatesAFile(marker)
    torch.save(state, tmp_path / "hostile.pt")
    for command, args in ((evaluate, []), (finetune_lc, ["--out", tmp_path / "lc"])):
        result = invoke(command, ["--ckpt", tmp_path / "hostile.pt", *args])
        assert result.exit_code == 2 and "cannot load checkpoint" in result.output, result.output
        assert not marker.exists()
    torch.load(tmp_path / "hostile.pt", weights_only=False)  # the control: a plain load runs it
    assert marker.exists()


@pytest.mark.slow
def test_lc_start_epoch_and_split_forward(tmp_path):
    """mt.pt holds the epoch LC starts from (CIFAR-10: 600 of 800), mt_final.pt MT's own end; the
    forward mode goes into the config and stage 2 keeps it."""
    res = run("train_mt.py", *overriding(TINY, "--epochs", "2"), "--lc-start-epoch", "1", "--forward", "split", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "mt.pt after epoch 1" in res.stdout and "split forward" in res.stdout
    mt, final = (torch.load(tmp_path / n, weights_only=True) for n in ("mt.pt", "mt_final.pt"))
    assert (mt["epoch"], final["epoch"]) == (1, 3) and mt["config"]["forward"] == "split"
    assert "teacher_error" in mt["metrics"][-1]  # a milestone epoch is evaluated
    res = run("finetune_lc.py", "--ckpt", tmp_path / "mt.pt", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert torch.load(tmp_path / "lc.pt", weights_only=True)["config"]["forward"] == "split"
    result = invoke(train_mt, [*TINY, "--lc-start-epoch", "3", "--out", tmp_path / "x"])
    assert result.exit_code == 2 and "--lc-start-epoch 3 is past the run's 1+1 epochs" in result.output


@pytest.mark.slow
def test_progress_lines_inside_long_epochs(tmp_path):
    res = run("train_mt.py", "--width", "0.0625", "--labeled-batch", "10", "--unlabeled-batch", "10", "--epochs", "1",
              "--decay-epochs", "0", "--device", "cpu", "--out", tmp_path)  # 133 steps in the epoch
    assert res.returncode == 0, res.stderr
    assert "mt epoch 1/1: step 100/133" in res.stdout and "s/step" in res.stdout


@pytest.mark.slow
def test_control_is_named_and_paired_with_lc(mt_run, tmp_path):
    """A stage-2 run with lambda2 0 is LC's control ("MT, continued"), and evaluate.py sets each MT+LC
    run against the control from the same MT checkpoint: the paired difference."""
    common = ["--ckpt", mt_run / "mt.pt", "--epochs", "1", "--decay-epochs", "0", "--eps-scale", "normalized"]
    control = run("finetune_lc.py", *common, "--lam", "0", "--out", tmp_path / "control")
    assert control.returncode == 0, control.stderr
    assert "lambda2 0: LC is off; this run is LC's control" in control.stdout
    for lam in ("2", "5"):
        res = run("finetune_lc.py", *common, "--lam", lam, "--out", tmp_path / f"lc{lam}")
        assert res.returncode == 0, res.stderr
        assert torch.load(tmp_path / f"lc{lam}" / "lc.pt", weights_only=True)["config"]["lc"]["eps_scale"] == "normalized"
    ckpts = [tmp_path / "control" / "lc.pt", tmp_path / "lc2" / "lc.pt", tmp_path / "lc5" / "lc.pt"]
    result = invoke(evaluate, ["--ckpt", *ckpts, "--json", "--table", tmp_path / "t.md"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    lc_name = "MT+LC (normalized eps, same-prediction pairs)"  # digits' default pairs
    assert [r["method"] for r in rows[:3]] == ["MT, continued (lambda2 0)"] + [lc_name] * 2
    paired = [r for r in rows if "paired" in r]  # lambda2 2 and 5 are two methods' settings: a pair each
    assert [(r["paired"], r["pairs"], r["setting"]) for r in paired] == [
        (f"{lc_name} minus MT, continued (lambda2 0)", 1, f"digits, 100 labels [lc.lam {lam}]") for lam in (2.0, 5.0)]
    for r, i in zip(paired, (1, 2)):
        assert r["teacher_difference_mean"] == pytest.approx(rows[i]["teacher_error"] - rows[0]["teacher_error"])
    table = (tmp_path / "t.md").read_text()
    assert "| MT, continued (lambda2 0) |" in table and "Paired difference" in table
    assert stage_label(lines(tmp_path / "control" / "lc_metrics.jsonl")) == "MT, continued"  # --curves' legend
    assert stage_label(lines(tmp_path / "lc2" / "lc_metrics.jsonl")) == "MT+LC"
